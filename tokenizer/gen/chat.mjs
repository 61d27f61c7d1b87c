// Regenerates kvroute's chat-template golden vectors:
//   cd tokenizer/gen && npm ci && node chat.mjs
//
// Each case is an OpenAI chat completions body. It is turned into template
// input the way vLLM does (content parts joined with "\n", null content ""
// , tool call arguments parsed into objects, only role/content/tool_calls/
// reasoning/tool_call_id/name kept), rendered with @huggingface/jinja (which
// renders as Python's Jinja2 does) with transformers' variables (special tokens
// from tokenizer_config.json, messages, tools, add_generation_prompt, then
// chat_template_kwargs), and encoded with the Hugging Face tokenizers library
// without adding special tokens, as vLLM encodes rendered chats.
//
// Output: ../testdata/chat/<template>.jsonl, one case per line:
//   {"case", "template", "tokenizer", "request", "text", "ids"} or {..., "error"}.
import { readFileSync, writeFileSync, mkdirSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { dirname, join } from "node:path";
import { Template } from "@huggingface/jinja";
import { Tokenizer } from "tokenizers";

const here = dirname(fileURLToPath(import.meta.url));
const testdata = join(here, "..", "testdata");
const templates = JSON.parse(readFileSync(join(testdata, "chat_templates.json"), "utf8"));

// Which real template renders with which tokenizer folder.
const families = [
  { name: "llama3.1", key: "library/llama3.1:8b", tokenizer: "llama3" },
  { name: "qwen2.5", key: "library/qwen2.5:0.5b", tokenizer: "qwen3" },
  { name: "qwen3", key: "library/qwen3:0.6b", tokenizer: "qwen3" },
  { name: "mistral", key: "library/mistral:7b-instruct-fp16", tokenizer: "mistral-sp" },
  { name: "deepseek-v3", key: "library/deepseek-v3:671b", tokenizer: "deepseek_v3" },
  // Extra coverage from the same file. Llama 3.2 would print today's date
  // through strftime_now, so its cases pin date_string.
  { name: "llama3.2", key: "library/llama3.2:3b", tokenizer: "llama3", kwargs: { date_string: "26 Jul 2024" } },
  { name: "mixtral", key: "library/mixtral:8x7b", tokenizer: "mistral-sp" },
  { name: "mistral-small", key: "library/mistral-small:24b", tokenizer: "mistral-sp" },
  { name: "phi4", key: "library/phi4:14b", tokenizer: "qwen3" },
  // Gemma 3's template loops over message content, so vLLM hands it content
  // as a list of parts. gonja cannot parse its parenthesized conditional
  // expression; this copy spells it as an if block, nothing else changed.
  {
    name: "gemma3-parts",
    key: "library/gemma3:1b",
    tokenizer: "mistral-sp",
    parts: true,
    rewrite: (t) => t.replace(`{{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else "") }}`,
      `{{ '<start_of_turn>' + role + '\n' }}{% if loop.first %}{{ first_user_prefix }}{% endif %}`),
  },
];

const weatherTool = {
  type: "function",
  function: {
    name: "get_weather",
    description: "Current weather for a city — in °C, \"quoted\" & <b>bold</b>",
    parameters: {
      type: "object",
      properties: {
        city: { type: "string", description: "City name, e.g. Zürich or 東京" },
        unit: { enum: ["celsius", "fahrenheit"], type: "string" },
      },
      required: ["city"],
    },
  },
};
const searchTool = {
  type: "function",
  function: {
    name: "search",
    parameters: { properties: { query: { type: "string" }, limit: { type: "integer", default: 5 } }, type: "object" },
    description: "Search the web",
  },
};

const cases = [
  {
    case: "system_multi_turn",
    body: {
      model: "m",
      messages: [
        { role: "system", content: "You are a terse assistant.  " },
        { role: "user", content: "What is the capital of France?" },
        { role: "assistant", content: "Paris." },
        { role: "user", content: "And of Japan? Answer in 日本語 😀" },
        { role: "assistant", content: "東京です。" },
        { role: "user", content: "Thanks!\n\nOne more:  what's 2+2?" },
      ],
    },
  },
  {
    case: "multi_turn",
    body: {
      messages: [
        { role: "user", content: "  Leading and trailing spaces  " },
        { role: "assistant", content: "Noted.\n" },
        { role: "user", content: "Tabs\tand\r\nnewlines, code: `for i in range(10):\n    print(i)`" },
      ],
    },
  },
  {
    case: "single_turn",
    body: { messages: [{ role: "user", content: "Hello there" }] },
  },
  {
    case: "content_parts",
    body: {
      messages: [
        { role: "user", content: [{ type: "text", text: "First part." }, { type: "text", text: "Second part  " }] },
      ],
      add_generation_prompt: true,
    },
  },
  {
    case: "no_generation_prompt",
    body: {
      messages: [
        { role: "user", content: "Say hi." },
        { role: "assistant", content: "Hi!" },
      ],
      add_generation_prompt: false,
    },
  },
  {
    case: "tools",
    body: {
      messages: [
        { role: "system", content: "Use tools when helpful." },
        { role: "user", content: "Weather in Zürich?" },
        {
          role: "assistant",
          content: null,
          tool_calls: [
            {
              id: "call_1",
              type: "function",
              function: { name: "get_weather", arguments: "{\"unit\": \"celsius\", \"city\": \"Zürich\"}" },
            },
          ],
        },
        { role: "tool", tool_call_id: "call_1", content: "{\"temp\": 21.5, \"sky\": \"clear\"}" },
        { role: "user", content: "And tomorrow?" },
      ],
      tools: [weatherTool, searchTool],
    },
  },
  {
    case: "role_alternation",
    body: {
      messages: [
        { role: "user", content: "first" },
        { role: "user", content: "second" },
      ],
    },
  },
  {
    case: "template_kwargs",
    body: {
      messages: [
        { role: "system", content: "Be brief." },
        { role: "user", content: "Plan a trip." },
      ],
      chat_template_kwargs: { enable_thinking: false, date_string: "01 Jan 2026" },
    },
  },
  {
    case: "reasoning_history",
    body: {
      messages: [
        { role: "user", content: "2+2?" },
        { role: "assistant", content: "<think>\nadd them\n</think>\n\n4" },
        { role: "user", content: "3+3?" },
      ],
    },
  },
  {
    case: "continue_final_message",
    body: {
      messages: [
        { role: "user", content: "Write a haiku." },
        { role: "assistant", content: "Autumn moonlight  " },
      ],
      add_generation_prompt: false,
      continue_final_message: true,
    },
  },
];

// normalize applies vLLM's message preprocessing: content joined into one
// string, or with parts (the "openai" content format) kept as a list of text
// parts, except for tool results, which vLLM always flattens.
function normalize(messages, parts = false) {
  return messages.map((m) => {
    const out = { role: m.role, content: parts && m.role !== "tool" ? contentParts(m.content) : contentText(m.content) };
    if (m.role === "assistant") {
      if (m.tool_calls != null && m.tool_calls.length > 0) {
        out.tool_calls = m.tool_calls.map((call) => {
          const fn = { ...call.function, arguments: parseArguments(call.function.arguments) };
          return { ...call, function: fn };
        });
      }
      if (m.reasoning != null) {
        out.reasoning = m.reasoning;
        out.reasoning_content = m.reasoning;
      }
    } else if (m.role === "tool" && m.tool_call_id != null) {
      out.tool_call_id = m.tool_call_id;
    }
    if (typeof m.name === "string" && m.name !== "") out.name = m.name;
    return out;
  });
}

function contentParts(content) {
  if (content == null) return [];
  if (typeof content === "string") return [{ type: "text", text: content }];
  return content
    .map((p) => (typeof p === "string" ? p : p.text))
    .filter((t) => t != null)
    .map((text) => ({ type: "text", text }));
}

function contentText(content) {
  if (content == null) return "";
  if (typeof content === "string") return content;
  return content
    .map((p) => (typeof p === "string" ? p : p.text))
    .filter((t) => t != null)
    .join("\n");
}

function parseArguments(args) {
  if (!args) return {};
  if (typeof args === "object") return Array.isArray(args) ? {} : args;
  try {
    const v = JSON.parse(args);
    return v !== null && typeof v === "object" && !Array.isArray(v) ? v : {};
  } catch {
    return {};
  }
}

// cutAfterFinalMessage is transformers' continue_final_message: end the text
// where the last message's content ends.
function cutAfterFinalMessage(text, messages) {
  let final = messages[messages.length - 1].content;
  if (Array.isArray(final)) {
    // transformers continues the last text part of a list content.
    final = [...final].reverse().find((p) => "text" in p).text;
  }
  const stripped = final.trim();
  const loc = text.lastIndexOf(stripped);
  if (loc < 0) throw new Error("continue_final_message is set but the final message does not appear in the chat");
  const left = final.trimStart();
  if (text.slice(loc, loc + left.length) === final) return text.slice(0, loc + left.length);
  return text.slice(0, loc + stripped.length);
}

// specialTokens mirrors transformers' special_tokens_map.
function specialTokens(config) {
  const out = {};
  for (const key of ["bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"]) {
    const v = config[key];
    const s = typeof v === "string" ? v : v && typeof v === "object" ? v.content : null;
    if (s) out[key] = s;
  }
  if (Array.isArray(config.additional_special_tokens) && config.additional_special_tokens.length > 0) {
    out.additional_special_tokens = config.additional_special_tokens.map((t) => (typeof t === "string" ? t : t.content));
  }
  return out;
}

// pythonTypeError reports what Python's Jinja2 raises where @huggingface/jinja
// instead stringifies an object inside a string concatenation.
function pythonDivergence(text) {
  if (text.includes("[object Map]") || text.includes("[object Object]")) {
    return 'can only concatenate str (not "dict") to str';
  }
  return null;
}

const out = join(testdata, "chat");
mkdirSync(out, { recursive: true });
const tokenizers = new Map();
for (const fam of families) {
  const dir = join(testdata, fam.tokenizer);
  if (!tokenizers.has(fam.tokenizer)) tokenizers.set(fam.tokenizer, Tokenizer.fromFile(join(dir, "tokenizer.json")));
  const tok = tokenizers.get(fam.tokenizer);
  const config = JSON.parse(readFileSync(join(dir, "tokenizer_config.json"), "utf8"));
  const source = fam.rewrite ? fam.rewrite(templates[fam.key]) : templates[fam.key];
  if (fam.rewrite && source === templates[fam.key]) throw new Error(fam.name + ": rewrite did not apply");
  const template = new Template(source);
  const lines = [];
  for (const c of cases) {
    const body = c.body;
    const vars = {
      ...specialTokens(config),
      messages: normalize(body.messages, fam.parts),
      tools: body.tools ?? null,
      documents: null,
      add_generation_prompt: body.add_generation_prompt ?? true,
      ...(body.chat_template_kwargs ?? {}),
    };
    const request = fam.kwargs ? { ...body, chat_template_kwargs: { ...fam.kwargs, ...(body.chat_template_kwargs ?? {}) } } : body;
    Object.assign(vars, request.chat_template_kwargs ?? {});
    const rec = { case: c.case, template: fam.key, tokenizer: fam.tokenizer, request };
    if (fam.rewrite) rec.template_source = source;
    try {
      let text = template.render(vars);
      if (body.continue_final_message) text = cutAfterFinalMessage(text, vars.messages);
      const divergence = pythonDivergence(text);
      if (divergence) {
        rec.error = divergence;
      } else {
        rec.text = text;
        rec.ids = (await tok.encode(text, null, { addSpecialTokens: false })).getIds();
      }
    } catch (e) {
      rec.error = e.message;
    }
    lines.push(JSON.stringify(rec));
  }
  writeFileSync(join(out, fam.name + ".jsonl"), lines.join("\n") + "\n");
  console.log(fam.name, lines.length, "cases");
}

// A probe template that prints what templates receive, so the Go side proves
// it hands them the same ordered structures (request key order, vLLM's
// message rebuilding, Python's json.dumps spelling).
const probe = new Template("{{ tools | tojson }}\n{{ messages | tojson(indent=2) }}\n{{ messages[-1]['role'] }}");
const probeLines = cases.map((c) =>
  JSON.stringify({
    case: c.case,
    template: "probe",
    request: c.body,
    text: probe.render({ messages: normalize(c.body.messages), tools: c.body.tools ?? null }),
  }),
);
writeFileSync(join(out, "probe.jsonl"), probeLines.join("\n") + "\n");
console.log("probe", probeLines.length, "cases");
