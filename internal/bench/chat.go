package bench

import (
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"strings"
	"time"
)

// ChatOptions shapes a multi-turn chat workload with real English-like text,
// sent through /v1/chat/completions so the router's tokenizer and chat
// template are exercised.
type ChatOptions struct {
	Model string
	// Sessions conversations of Turns turns each.
	Sessions, Turns int
	// SystemPrompts distinct system prompts are shared among the sessions
	// (session i uses prompt i mod SystemPrompts); SystemWords long.
	SystemPrompts, SystemWords int
	// UserWords per user message; ReplyWords per assistant message placed
	// in the history (the client plays back a fixed reply, not the model's).
	UserWords, ReplyWords int
	// OutputTokens is max_tokens of every turn.
	OutputTokens int
	// Think is the pause between a turn's answer and the next turn.
	Think time.Duration
	Seed  uint64
	// Encode, when set, tokenizes a chat body as the workers will (e.g.
	// sim.ChatEncoder.EncodeChat) so the reference hit rates can be
	// computed; without it they are not reported for this workload.
	Encode func(body []byte) ([]uint32, error)
	// Images, when positive, makes it a multimodal chat: each session's
	// first user message carries this many images drawn from a pool of
	// ImagePool images shared by all sessions (data: URLs of PNG headers of
	// the sizes in ImageSizes), and every later turn re-sends them in the
	// history, so users re-send the same images across turns and sessions
	// share some. The model must be served as a vision-language model
	// (kvroute --mm-model, kvsim --mm-family). Reference hit rates are not
	// computed for it (Encode is ignored): token ids alone cannot tell
	// images of one size apart.
	Images, ImagePool int
	// ImageSizes are the pool's image sizes, cycled; empty means a mix of
	// photo sizes from 336×336 to 1920×1080.
	ImageSizes [][2]int
}

// defaultImageSizes are photo and screenshot sizes.
var defaultImageSizes = [][2]int{{640, 480}, {1024, 768}, {480, 640}, {1280, 720}, {336, 336}, {1920, 1080}, {800, 600}}

// pngImageURL is a data: URL holding a PNG signature and header of w×h
// (all that routers and simulated workers read) and tag, which makes
// images of one size distinct.
func pngImageURL(w, h int, tag string) string {
	var ihdr [13]byte
	binary.BigEndian.PutUint32(ihdr[0:], uint32(w))
	binary.BigEndian.PutUint32(ihdr[4:], uint32(h))
	ihdr[8], ihdr[9] = 8, 2 // 8-bit RGB
	b := []byte("\x89PNG\r\n\x1a\n")
	b = binary.BigEndian.AppendUint32(b, 13)
	chunk := append([]byte("IHDR"), ihdr[:]...)
	b = append(b, chunk...)
	b = binary.BigEndian.AppendUint32(b, crc32.ChecksumIEEE(chunk))
	return "data:image/png;base64," + base64.StdEncoding.EncodeToString(append(b, tag...))
}

// imageChatMessage is a chat message whose content is a list of parts.
type imageChatMessage struct {
	Role    string `json:"role"`
	Content any    `json:"content"`
}

// words is the vocabulary of the synthetic conversations.
var words = strings.Fields(`the a of to and in is it you that he was for on are with as I his they be at one
have this from or had by hot word but what some we can out other were all there when up use your how said an
each she which do their time if will way about many then them write would like so these her long make thing
see him two has look more day could go come did number sound no most people my over know water than call first
who may down side been now find any new work part take get place made live where after back little only round
man year came show every good me give our under name very through just form sentence great think say help low
line differ turn cause much mean before move right boy old too same tell does set three want air well also play
small end put home read hand port large spell add even land here must big high such follow act why ask men
change went light kind off need house picture try us again animal point mother world near build self earth
father head stand own page should country found answer school grow study still learn plant cover food sun four
between state keep eye never last let thought city tree cross farm hard start might story saw far sea draw left
late run while press close night real life few north open seem together next white children begin got walk
example ease paper group always music those both mark often letter until mile river car feet care second book
carry took science eat room friend began idea fish mountain stop once base hear horse cut sure watch color face
wood main enough plain girl usual young ready above ever red list though feel talk bird soon body dog family
direct pose leave song measure door product black short numeral class wind question happen complete ship area
half rock order fire south problem piece told knew pass since top whole king space heard best hour better true
during hundred five remember step early hold west ground interest reach fast verb sing listen six table travel
less morning ten simple several vowel toward war lay against pattern slow center love person money serve appear
road map rain rule govern pull cold notice voice unit power town fine certain fly fall lead cry dark machine`)

// sentence returns n words drawn from r, capitalized and punctuated.
func sentence(r *rand.Rand, n int) string {
	var b strings.Builder
	for i := 0; i < n; i++ {
		w := words[r.IntN(len(words))]
		if i == 0 {
			w = strings.ToUpper(w[:1]) + w[1:]
		} else {
			b.WriteByte(' ')
		}
		b.WriteString(w)
		if i%12 == 11 && i != n-1 {
			b.WriteByte(',')
		}
	}
	b.WriteByte('.')
	return b.String()
}

// ChatWorkload builds one flow per session; turn k carries the whole
// history (system prompt, k user messages and k-1 replies), so each turn's
// prompt extends the previous one.
func ChatWorkload(opt ChatOptions) (*Workload, error) {
	if opt.Sessions <= 0 || opt.Turns <= 0 || opt.SystemPrompts <= 0 || opt.SystemWords <= 0 ||
		opt.UserWords <= 0 || opt.ReplyWords <= 0 || opt.OutputTokens <= 0 {
		return nil, fmt.Errorf("chat workload: every count and length must be positive: %+v", opt)
	}
	w := &Workload{Name: "chat", Params: map[string]any{
		"sessions": opt.Sessions, "turns": opt.Turns, "system_prompts": opt.SystemPrompts,
		"system_words": opt.SystemWords, "user_words": opt.UserWords, "reply_words": opt.ReplyWords,
		"output_tokens": opt.OutputTokens, "think_ms": opt.Think.Milliseconds(), "model": opt.Model,
	}}
	sizes := opt.ImageSizes
	if len(sizes) == 0 {
		sizes = defaultImageSizes
	}
	if opt.Images > 0 {
		w.Name = "image-chat"
		w.Params["images"], w.Params["image_pool"] = opt.Images, opt.ImagePool
	}
	systems := make([]string, opt.SystemPrompts)
	for i := range systems {
		r := rand.New(rand.NewPCG(opt.Seed, uint64(i)))
		systems[i] = "You are assistant number " + fmt.Sprint(i) + ". " + sentence(r, opt.SystemWords)
	}
	for s := 0; s < opt.Sessions; s++ {
		r := rand.New(rand.NewPCG(opt.Seed, 1<<32+uint64(s)))
		msgs := []imageChatMessage{{Role: "system", Content: systems[s%len(systems)]}}
		fl := Flow{Think: opt.Think}
		for t := 0; t < opt.Turns; t++ {
			if t > 0 {
				msgs = append(msgs, imageChatMessage{Role: "assistant", Content: sentence(r, opt.ReplyWords)})
			}
			var content any = sentence(r, opt.UserWords)
			if t == 0 && opt.Images > 0 {
				parts := make([]any, 0, opt.Images+1)
				for k := 0; k < opt.Images; k++ {
					img := r.IntN(max(opt.ImagePool, 1))
					sz := sizes[img%len(sizes)]
					parts = append(parts, map[string]any{"type": "image_url", "image_url": map[string]any{
						"url": pngImageURL(sz[0], sz[1], fmt.Sprintf("kvbench image %d", img))}})
				}
				content = append(parts, map[string]any{"type": "text", "text": content})
			}
			msgs = append(msgs, imageChatMessage{Role: "user", Content: content})
			body, err := json.Marshal(map[string]any{
				"model": opt.Model, "messages": msgs, "max_tokens": opt.OutputTokens, "ignore_eos": true,
				"stream": true, "stream_options": map[string]any{"include_usage": true},
			})
			if err != nil {
				return nil, fmt.Errorf("chat body: %w", err)
			}
			it := Item{Path: PathChat, Body: body, OutputLen: opt.OutputTokens}
			if t > 0 {
				it.Follows = &ItemRef{Flow: s, Item: t - 1}
			}
			if opt.Encode != nil && opt.Images == 0 {
				ids, err := opt.Encode(body)
				if err != nil {
					return nil, fmt.Errorf("chat workload: tokenize session %d turn %d: %w", s, t, err)
				}
				it.Prompt = make([]int32, len(ids))
				for i, id := range ids {
					it.Prompt[i] = int32(id)
				}
				it.PromptLen = len(ids)
			}
			fl.Items = append(fl.Items, it)
		}
		w.Flows = append(w.Flows, fl)
	}
	return w, nil
}
