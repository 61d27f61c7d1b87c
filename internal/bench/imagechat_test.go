package bench

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestImageChatWorkloadResendsImages(t *testing.T) {
	w, err := ChatWorkload(ChatOptions{Model: "m", Sessions: 6, Turns: 3, SystemPrompts: 2, SystemWords: 5,
		UserWords: 3, ReplyWords: 3, OutputTokens: 4, Seed: 1, Images: 2, ImagePool: 3})
	if err != nil {
		t.Fatal(err)
	}
	if w.Name != "image-chat" || len(w.Flows) != 6 {
		t.Fatalf("%s with %d flows", w.Name, len(w.Flows))
	}
	urls := map[string]int{}
	for _, fl := range w.Flows {
		var first []string
		for k, it := range fl.Items {
			var body struct {
				Messages []struct {
					Content json.RawMessage `json:"content"`
				} `json:"messages"`
			}
			if err := json.Unmarshal(it.Body, &body); err != nil {
				t.Fatal(err)
			}
			var parts []struct {
				ImageURL struct{ URL string } `json:"image_url"`
			}
			if err := json.Unmarshal(body.Messages[1].Content, &parts); err != nil {
				t.Fatalf("turn %d: the first user message is not a list of parts: %v", k, err)
			}
			var got []string
			for _, p := range parts {
				if strings.HasPrefix(p.ImageURL.URL, "data:image/png;base64,") {
					got = append(got, p.ImageURL.URL)
				}
			}
			if len(got) != 2 {
				t.Fatalf("turn %d: %d images", k, len(got))
			}
			if k == 0 {
				first = got
				for _, u := range got {
					urls[u]++
				}
			} else if got[0] != first[0] || got[1] != first[1] {
				t.Fatalf("turn %d re-sends other images", k)
			}
			if it.Prompt != nil {
				t.Fatal("image chats carry no reference prompt")
			}
		}
	}
	if len(urls) > 3 {
		t.Fatalf("%d distinct images from a pool of 3", len(urls))
	}
}
