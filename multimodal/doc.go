// Package multimodal holds what the router needs to place images in a
// prompt exactly as the model server will: one identity per image (the
// client's uuid, else a SHA-256 the router injects as the uuid), image
// sizes read from headers only, and the processors' token counts for the
// families it knows (Qwen2-VL / Qwen2.5-VL, Qwen3-VL smart-resize; Gemma 3's
// fixed 256 soft tokens). It is pure: no I/O, no pixel decoding.
package multimodal
