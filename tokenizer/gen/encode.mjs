// Regenerates kvroute's tokenizer golden vectors with Hugging Face's
// reference tokenizer (npm `tokenizers` 0.23.x, prebuilt, offline).
//
//   cd tokenizer/gen && npm install && node encode.mjs
//
// Writes, deterministically (seeded PRNG, no clock, no network):
//   ../testdata/corpus.txt                 mixed prose/code/multilingual text (> 500 KB)
//   ../testdata/golden/<family>.jsonl.gz   one JSON object per line:
//     {"text": "...", "add_special_tokens": bool, "ids": [...], "decoded": "..."}   (>= 2,000 strings x 2 modes)
//     {"corpus": true, "ids": [...]}                              (corpus.txt, no special tokens)
//   ../testdata/golden/variants/<name>.jsonl.gz   the same for ../testdata/variants/variants.json:
//     a base family's tokenizer.json with other normalizers, pre-tokenizers, added tokens,
//     post-processors and decoders swapped in, to pin every component against the reference.
// and prints the reference's encoding speed on the corpus.
import fs from 'node:fs';
import path from 'node:path';
import zlib from 'node:zlib';
import { fileURLToPath } from 'node:url';
import tokenizers from 'tokenizers';

const { Tokenizer } = tokenizers;
const here = path.dirname(fileURLToPath(import.meta.url));
const testdata = path.join(here, '..', 'testdata');
const families = ['llama3', 'qwen3', 'mistral-sp', 'deepseek_v3'];
const STRINGS = 2200;

// mulberry32: small, seedable, identical on every machine.
function rng(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

function makeGen(seed) {
  const r = rng(seed);
  const int = (n) => Math.floor(r() * n);
  const pick = (a) => a[int(a.length)];
  const range = (lo, hi) => String.fromCodePoint(lo + int(hi - lo + 1));
  const repeat = (n, f) => Array.from({ length: n }, f).join('');
  return { r, int, pick, range, repeat };
}

const words = ('the of and to in is that it for on with as was he be at by this had not are but from or have an they ' +
  'which one you were her all she there would their we him been has when who will more no if out so said what up its ' +
  'about into than them can only other new some could time these two may then do first any my now such like our over ' +
  'man me even most made after also did many before must through back years where much your way well down should ' +
  'because each just those people how too little state good very make world still own see men work long get here ' +
  'between both life being under never day same another know while last might us great old year off come since ' +
  'against go came right used take three router cache token prefix worker latency throughput kernel tensor batch ' +
  'request response stream gateway envoy cluster replica shard lease index hash block model prompt').split(' ');
const contractions = ["it's", "don't", "I'm", "we'll", "they're", "you've", "she'd", "IT'S", "DON'T", "WE'LL",
  "THEY'RE", "YOU'VE", "I'M", "SHE'D", "It'S", "'LL", "'ll", "'Re", "'s", "'t", "o'clock", "rock'n'roll", "'ſ",
  "can't", "won't", "'twas", "y'all", "L'HÔPITAL", "dell'arte"];
const latinExt = ['café', 'naïve', 'résumé', 'Ångström', 'straße', 'İstanbul', 'ſtraße', 'œuvre', 'Æsir', 'façade',
  'Ørsted', 'Łódź', 'Zürich', 'São Paulo', 'ǅemal', 'ﬁnance', 'ｆｕｌｌｗｉｄｔｈ', 'ÀÉÎÕÜ', 'ĳssel', 'ŉ'];
const code = [
  'func main() {\n\tfmt.Println("hello, 世界")\n}\n',
  'def f(x: int) -> int:\n    return x ** 2  # square\n',
  'const add = (a, b) => a + b;\nconsole.log(add(1, 2));\n',
  'fn main() { let v: Vec<u8> = vec![0x7f, 0xff]; println!("{:?}", v); }',
  '{"model": "Qwen/Qwen3-8B", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 128}',
  '<div class="x" id=\'y\'>&amp; &lt;tag&gt;</div>',
  'SELECT id, name FROM users WHERE age >= 21 AND name LIKE \'%an%\';',
  'for i in $(seq 1 10); do echo "$i" >> /tmp/out.log; done',
  '#include <stdio.h>\nint main(void){printf("%d\\n", 42);return 0;}',
  'if (a && b || !c) { x += y << 2; } else { x -= y >> 3; }',
  '    indented_line = [1, 2, 3]\n\t\ttabbed = {"k": None}\n',
  'x=1;y=2;z=x*y/3.14159e-10',
  '@@ -1,4 +1,5 @@\n-old line\n+new line\n',
  'import numpy as np\narr = np.zeros((3, 4), dtype=np.float32)\n',
];
const urls = ['https://example.com/path/to/page?query=1&lang=en#frag', 'http://127.0.0.1:8080/v1/chat/completions',
  'mailto:someone@example.org', 'ftp://files.example.net/pub/file-1.2.3.tar.gz', 'www.wikipedia.org/wiki/Tokenization',
  '/usr/local/bin/kvroute', 'C:\\Users\\me\\Documents\\file.txt', 'git@github.com:owner/repo.git'];
const emoji = ['😀', '😂', '🙏', '👍', '👍🏽', '👍🏿', '👨‍👩‍👧‍👦', '🧑🏻‍💻', '🏳️‍🌈', '🇺🇸', '🇯🇵🇫🇷', '1️⃣', '❤️', '❤', '✨', '🔥🔥🔥',
  '👩‍❤️‍💋‍👨', '🤷‍♂️', '🫠', '☕', '™', '©', '♥', '→', '∑', '√', '∞', '€', '¥', '£'];
const weird = ['\uFFFD', '\u200B', '\u200C', '\u200D', '\u2060', '\uFEFF', '\u00AD', '\u202E', '\u2028', '\u2029', '\u0000',
  '\u0001', '\u001B[31m', '\u007F', '\u0085', '<0xFF>', '<0x0A>', '\\x00', '\\u0000', '�', '\uE000', '\uF8FF',
  '<|im_start', '|>', '<|', '<s', '</s', '<｜', '▁', '▁▁', 'Ġ', 'Ċ', 'ĠĠ', '\u0301', '\u0308\u0301', '𝔘𝔫𝔦𝔠𝔬𝔡𝔢', '𝟙𝟚𝟛',
  '\u{10FFFD}', '\u{E0001}', 'ℌ', 'Ⅻ', '½', '²³', '①②'];
const ws = [' ', '  ', '   ', '\t', '\t\t', '\n', '\n\n', '\r\n', '\r\n\r\n', ' \n', '\n ', ' \t ', '\u00A0', '\u3000',
  '\u2003', '\u2009', '\v', '\f', '\r', '\n\n\n', '    ', '        ', ' \r\n\t'];

function fragment(g, specials) {
  const { int, pick, range, repeat } = g;
  switch (int(23)) {
    case 22: return pick(['getHTTPResponse', "McDonald's", 'iPhone', 'XMLHttpRequest', 'ǅungla', 'ʰello', 'ＡＢＣｄｅｆ',
      'ΣΊΣΥΦΟΣ', 'Ǆǅǆ', "DON'T's", "O'NEIL'S", 'camelCaseWord', 'snake_case_word', 'HTML5Parser', 'ÉCOLEétudiant',
      'aÀbÁ', 'ĲsselMeer', 'ⅫⅩ', 'ǈubljana', 'ʻOkina', 'Ｗｉｄｅ', 'a/b/c', "path/to/file's", 'ABC/def\n']);
    case 0: case 1: case 2: {
      const n = 1 + int(12);
      let s = repeat(n, () => pick(words) + ' ').trimEnd();
      if (int(3) === 0) s = s[0].toUpperCase() + s.slice(1) + pick(['.', '!', '?', ',', ';', ':', '...', '']);
      if (int(5) === 0) s = s.toUpperCase();
      return s;
    }
    case 3: return pick(contractions);
    case 4: return pick(latinExt);
    case 5: return repeat(1 + int(8), () => pick([range(0x4e00, 0x9fa5), range(0x3041, 0x3096), range(0x30a1, 0x30fa),
      pick(['。', '、', '「', '」', '！', '？', '・', 'ー'])]));
    case 6: return repeat(1 + int(10), () => range(0xac00, 0xd7a3)) + pick(['', ' ', '.']);
    case 7: return repeat(1 + int(4), () => repeat(2 + int(8), () => range(0x0430, 0x044f)) + ' ').trim();
    case 8: return repeat(1 + int(4), () => repeat(2 + int(6), () => range(0x0621, 0x064a) +
      (int(3) === 0 ? range(0x064b, 0x0652) : '')) + ' ').trim();
    case 9: return repeat(1 + int(4), () => repeat(1 + int(5), () => range(0x0905, 0x0939) +
      pick(['', '\u093e', '\u093f', '\u0940', '\u0947', '\u094d', '\u0902'])) + ' ').trim() + pick(['', '।', ' ०१२३']);
    case 10: return repeat(2 + int(12), () => range(0x0e01, 0x0e2e) + pick(['', '', '\u0e31', '\u0e34', '\u0e35', '\u0e48', '\u0e49']));
    case 11: return repeat(1 + int(4), () => pick(emoji));
    case 12: return repeat(1 + int(4), () => pick(['a', 'e', 'o', 'n', 'A', 'u']) +
      repeat(1 + int(3), () => range(0x0300, 0x036f)));
    case 13: {
      const d = repeat(1 + int(20), () => String(int(10)));
      return pick([d, d + '.' + String(int(1000)), '-' + d, d.replace(/(\d)(?=(\d{3})+$)/g, '$1,'), '１２３４５',
        '٠١٢٣٤٥', '०१२३', '3.14159', '1e-9', '0x' + d, 'v' + d + '.' + int(10)]);
    }
    case 14: return pick(ws);
    case 15: return pick(code);
    case 16: return pick(urls);
    case 17: case 18: return specials.length ? pick(specials) : '<s>';
    case 19: return pick(weird);
    case 20: return repeat(1 + int(6), () => range(0x03b1, 0x03c9)) + ' ' + repeat(1 + int(6), () => range(0x05d0, 0x05ea));
    default: return repeat(1 + int(5), () => pick(['!', '?', '.', ',', '-', '--', '...', '"', "'", '(', ')', '[', ']',
      '{', '}', '*', '**', '#', '##', '`', '```', '~', '|', '/', '\\', '+', '=', '<', '>', '&', '%', '$', '@', '^', '_']));
  }
}

function makeStrings(seed, specials) {
  const g = makeGen(seed);
  const seps = ['', ' ', ' ', ' ', '\n', '\t', '  ', '\r\n', ''];
  const out = [];
  while (out.length < STRINGS) {
    const n = 1 + g.int(8);
    let s = '';
    for (let k = 0; k < n; k++) s += (k ? g.pick(seps) : '') + fragment(g, specials);
    if (g.int(6) === 0) s = g.pick(ws) + s;
    if (g.int(6) === 0) s = s + g.pick(ws);
    out.push(s);
  }
  // A few fixed edge cases every family must get right.
  out.push('', ' ', '  ', '\n', 'a', ' a', 'a ', '\u00e9', 'e\u0301', '\ud55c\uad6d\uc5b4', 'Hello world',
    ' Hello world ', "I'M DON'T WE'LL", '1234567890', '   \n\n   x', 'x   \n\n   ', '\t\tfoo\n\t\tbar');
  return out;
}

function makeCorpus(seed, minBytes) {
  const g = makeGen(seed);
  const parts = [];
  let size = 0;
  while (size < minBytes) {
    let p;
    switch (g.int(6)) {
      case 0: case 1: case 2: { // prose paragraph
        const sentences = 2 + g.int(6);
        p = '';
        for (let k = 0; k < sentences; k++) {
          let s = g.repeat(4 + g.int(14), () => g.pick(g.int(10) === 0 ? contractions : words) + ' ').trimEnd();
          if (g.int(8) === 0) s += ', ' + String(g.int(100000));
          p += s[0].toUpperCase() + s.slice(1) + g.pick(['.', '.', '.', '?', '!']) + ' ';
        }
        p = p.trimEnd();
        break;
      }
      case 3: case 4: // code
        p = g.repeat(1 + g.int(4), () => g.pick(code));
        break;
      default: // multilingual and symbols
        p = g.repeat(2 + g.int(8), () => fragment(g, []) + g.pick([' ', ' ', '', '\n']));
    }
    p += g.pick(['\n\n', '\n', '\n\n\n', '\r\n\r\n']);
    parts.push(p);
    size += Buffer.byteLength(p);
  }
  return parts.join('');
}

async function main() {
  fs.mkdirSync(path.join(testdata, 'golden'), { recursive: true });
  const corpus = makeCorpus(20261122, 600 * 1024);
  fs.writeFileSync(path.join(testdata, 'corpus.txt'), corpus);
  console.log(`corpus.txt: ${Buffer.byteLength(corpus)} bytes`);
  for (const fam of families) {
    const file = path.join(testdata, fam, 'tokenizer.json');
    const tok = Tokenizer.fromFile(file);
    const json = JSON.parse(fs.readFileSync(file, 'utf8'));
    const specials = json.added_tokens.map((t) => t.content);
    const strings = makeStrings(1000 + families.indexOf(fam), specials);
    const lines = [];
    for (const text of strings) {
      for (const add of [false, true]) {
        const enc = await tok.encode(text, null, { addSpecialTokens: add });
        const ids = Array.from(enc.getIds());
        const decoded = await tok.decode(ids, false);
        lines.push(JSON.stringify({ text, add_special_tokens: add, ids, decoded }));
      }
    }
    const t0 = process.hrtime.bigint();
    const c0 = process.cpuUsage();
    const enc = await tok.encode(corpus, null, { addSpecialTokens: false });
    const secs = Number(process.hrtime.bigint() - t0) / 1e9;
    const cpu = process.cpuUsage(c0);
    const cpuSecs = (cpu.user + cpu.system) / 1e6;
    const ids = Array.from(enc.getIds());
    lines.push(JSON.stringify({ corpus: true, ids }));
    const out = path.join(testdata, 'golden', `${fam}.jsonl.gz`);
    fs.writeFileSync(out, zlib.gzipSync(lines.join('\n') + '\n', { level: 9 }));
    const mbs = Buffer.byteLength(corpus) / secs / 1e6;
    const cpuMbs = Buffer.byteLength(corpus) / cpuSecs / 1e6;
    console.log(`${fam}: ${strings.length} strings x 2, corpus ${ids.length} ids; ` +
      `reference speed ${mbs.toFixed(2)} MB/s wall, ${cpuMbs.toFixed(2)} MB per CPU-second`);
  }
}

// variants writes golden vectors for tokenizers assembled from a base family
// and the overrides in testdata/variants/variants.json.
async function variants() {
  const list = JSON.parse(fs.readFileSync(path.join(testdata, 'variants', 'variants.json'), 'utf8'));
  fs.mkdirSync(path.join(testdata, 'golden', 'variants'), { recursive: true });
  for (const [i, v] of list.entries()) {
    const json = JSON.parse(fs.readFileSync(path.join(testdata, v.base, 'tokenizer.json'), 'utf8'));
    Object.assign(json, v.override);
    Object.assign(json.model, v.model || {});
    json.added_tokens = json.added_tokens.concat(v.extra_tokens || []);
    const tok = Tokenizer.fromString(JSON.stringify(json));
    const specials = json.added_tokens.map((t) => t.content).concat(['word', 'and', 'hello world', 'Hello World', 'the',
      ' <mask> ', 'a-b--c', 'x1y22z', 'AND', 'words']);
    const strings = makeStrings(5000 + i, specials).slice(-600);
    const lines = [];
    for (const text of strings) {
      for (const add of [false, true]) {
        const ids = Array.from((await tok.encode(text, null, { addSpecialTokens: add })).getIds());
        lines.push(JSON.stringify({ text, add_special_tokens: add, ids, decoded: await tok.decode(ids, false) }));
      }
    }
    fs.writeFileSync(path.join(testdata, 'golden', 'variants', `${v.name}.jsonl.gz`),
      zlib.gzipSync(lines.join('\n') + '\n', { level: 9 }));
    console.log(`variant ${v.name}: ${strings.length} strings x 2`);
  }
}

main().then(variants).catch((e) => { console.error(e); process.exit(1); });
