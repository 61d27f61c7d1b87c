"""Writes a tiny Qwen3-architecture model with random weights for the vLLM
tests: 2 layers, hidden size 256, Qwen3's vocabulary of 151,936 tokens, and
the Qwen3 tokenizer the repository carries (tokenizer/testdata/qwen3). The
weights are seeded, so the same script writes the same model; nothing is
downloaded. Its answers are noise, which is all a router test needs: the
prompt tokens, the KV blocks they fill and the engine's cache hits are real.

usage: python tiny_model.py TOKENIZER_DIR OUT_DIR
"""

import os
import shutil
import sys

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM


def main(tok_dir, out):
    torch.manual_seed(20261128)
    cfg = Qwen3Config(
        vocab_size=151936,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        bos_token_id=151643,
        eos_token_id=151645,
        torch_dtype="bfloat16",
    )
    model = Qwen3ForCausalLM(cfg).to(torch.bfloat16)
    tmp = out + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(tok_dir, name), os.path.join(tmp, name))
    shutil.rmtree(out, ignore_errors=True)
    os.rename(tmp, out)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
