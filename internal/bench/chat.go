package bench

import (
	"fmt"
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
	systems := make([]string, opt.SystemPrompts)
	for i := range systems {
		r := rand.New(rand.NewPCG(opt.Seed, uint64(i)))
		systems[i] = "You are assistant number " + fmt.Sprint(i) + ". " + sentence(r, opt.SystemWords)
	}
	for s := 0; s < opt.Sessions; s++ {
		r := rand.New(rand.NewPCG(opt.Seed, 1<<32+uint64(s)))
		msgs := []chatMessage{{Role: "system", Content: systems[s%len(systems)]}}
		fl := Flow{Think: opt.Think}
		for t := 0; t < opt.Turns; t++ {
			if t > 0 {
				msgs = append(msgs, chatMessage{Role: "assistant", Content: sentence(r, opt.ReplyWords)})
			}
			msgs = append(msgs, chatMessage{Role: "user", Content: sentence(r, opt.UserWords)})
			body, err := chatBody(opt.Model, msgs, opt.OutputTokens)
			if err != nil {
				return nil, err
			}
			it := Item{Path: PathChat, Body: body, OutputLen: opt.OutputTokens}
			if t > 0 {
				it.Follows = &ItemRef{Flow: s, Item: t - 1}
			}
			if opt.Encode != nil {
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
