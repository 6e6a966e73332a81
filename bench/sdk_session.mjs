// The SDK workloads of scripts/bench, run through the stock TypeScript
// BetaLocalFilesystemMemoryTool of @anthropic-ai/sdk exactly as the SDK's tool runner calls it
// (`runRunnableTool(betaMemoryTool(await BetaLocalFilesystemMemoryTool.init(BASE)), input)`).
// Times are taken in-process with performance.now() around each tool call.
//
//   node sdk_session.mjs SDK_DIR session BASE COMMANDS SEED
//       BASE/memories pre-filled by bench/worker.py fill-memories (topicNNN/mNNNNNN.md).
//       Runs COMMANDS mixed commands (view /memories, view a file, create, str_replace,
//       insert, rename of a directory, delete of a file) chosen by a seeded PRNG; prints
//       {"total_s", "by_command": {command: [ms, ...]}}.
//   node sdk_session.mjs SDK_DIR view BASE REPEAT EXPECT_ENTRIES
//       `view /memories` REPEAT times; prints {"times_ms": [...], "entries": N}.
//
// Every call must succeed and say what the SDK says on a plain directory; otherwise this
// exits 1, so the benchmark cannot time a filesystem that gives wrong answers.
import { readdirSync } from 'node:fs';
import path from 'node:path';
import { pathToFileURL } from 'node:url';
import { performance } from 'node:perf_hooks';

const [sdkDir, mode, base, ...rest] = process.argv.slice(2);
if (!sdkDir || !mode || !base) {
  console.error('usage: node sdk_session.mjs SDK_DIR (session BASE COMMANDS SEED | view BASE REPEAT EXPECT)');
  process.exit(2);
}
const sdkUrl = (p) => pathToFileURL(path.join(sdkDir, p)).href;
const { BetaLocalFilesystemMemoryTool, betaMemoryTool } = await import(sdkUrl('tools/memory/node.mjs'));
const { runRunnableTool } = await import(sdkUrl('lib/tools/BetaRunnableTool.mjs'));

const tool = betaMemoryTool(await BetaLocalFilesystemMemoryTool.init(base));
let callNo = 0;

function fail(msg) {
  console.error(`sdk_session: ${msg}`);
  process.exit(1);
}

async function call(input, expect) {
  const t0 = performance.now();
  const { content, isError } = await runRunnableTool(tool, input, {
    toolUse: { type: 'tool_use', id: `toolu_bench_${callNo++}`, name: 'memory', input },
  });
  const ms = performance.now() - t0;
  const text = typeof content === 'string' ? content : JSON.stringify(content);
  if (isError) fail(`${JSON.stringify(input).slice(0, 200)} failed: ${text.slice(0, 500)}`);
  if (expect && !text.includes(expect)) {
    fail(`${JSON.stringify(input).slice(0, 200)}: output lacks ${JSON.stringify(expect)}: ${text.slice(0, 500)}`);
  }
  return { ms, text };
}

function listingEntries(text) {
  // header line, then "<size>\t/memories" and one line per entry
  return text.split('\n').length - 2;
}

// mulberry32: a small seeded PRNG, so every filesystem gets the same command sequence.
function prng(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

if (mode === 'view') {
  const repeat = Number(rest[0] ?? 5);
  const expect = Number(rest[1] ?? -1);
  const times = [];
  let entries = 0;
  for (let i = 0; i < repeat; i++) {
    const { ms, text } = await call({ command: 'view', path: '/memories' }, 'excluding hidden items and node_modules:');
    times.push(ms);
    entries = listingEntries(text);
    if (expect >= 0 && entries !== expect) fail(`view /memories listed ${entries} entries, want ${expect}`);
  }
  process.stdout.write(JSON.stringify({ times_ms: times, entries }) + '\n');
} else if (mode === 'session') {
  const commands = Number(rest[0] ?? 1000);
  const rand = prng(Number(rest[1] ?? 1));
  const pick = (arr) => arr[Math.floor(rand() * arr.length)];

  // The model of the store: topic -> [file names]; read once, untimed.
  const memRoot = path.join(base, 'memories');
  const topics = new Map();
  for (const t of readdirSync(memRoot).sort()) {
    topics.set(t, readdirSync(path.join(memRoot, t)).filter((f) => !f.startsWith('.')).sort());
  }
  if (topics.size === 0) fail(`${memRoot} holds no topic directories (pre-fill it first)`);
  const allFiles = () => [...topics].flatMap(([t, fs]) => fs.map((f) => [t, f]));
  const countEntries = () => topics.size + [...topics.values()].reduce((n, fs) => n + fs.length, 0);

  // The mix, per 1,000 commands.
  const mix = [
    ['view_dir', 20],
    ['view_file', 330],
    ['create', 200],
    ['str_replace', 200],
    ['insert', 100],
    ['rename_dir', 50],
    ['delete', 100],
  ];
  const total = mix.reduce((n, [, w]) => n + w, 0);
  const byCommand = Object.fromEntries(mix.map(([c]) => [c, []]));
  let created = 0;
  let renamed = 0;
  const t0 = performance.now();
  for (let k = 0; k < commands; k++) {
    let r = rand() * total;
    let cmd = mix[mix.length - 1][0];
    for (const [c, w] of mix) {
      if (r < w) {
        cmd = c;
        break;
      }
      r -= w;
    }
    const files = allFiles();
    if (files.length < 5 && (cmd === 'delete' || cmd === 'rename_dir')) cmd = 'create';
    let res;
    if (cmd === 'view_dir') {
      res = await call({ command: 'view', path: '/memories' }, 'excluding hidden items and node_modules:');
      const n = listingEntries(res.text);
      if (n !== countEntries()) fail(`view /memories listed ${n} entries, want ${countEntries()}`);
    } else if (cmd === 'view_file') {
      const [t, f] = pick(files);
      const name = f.replace(/\.md$/, '');
      res = await call({ command: 'view', path: `/memories/${t}/${f}` }, `[${name}:1]`);
    } else if (cmd === 'create') {
      const t = pick([...topics.keys()]);
      const name = `n${String(created++).padStart(6, '0')}`;
      const lines = [];
      const nLines = 3 + Math.floor(rand() * 20);
      for (let L = 1; L <= nLines; L++) lines.push(`- [${name}:${L}] the agent learned fact ${L} about ${t}`);
      res = await call(
        { command: 'create', path: `/memories/${t}/${name}.md`, file_text: lines.join('\n') + '\n' },
        'File created successfully at:',
      );
      topics.get(t).push(`${name}.md`);
    } else if (cmd === 'str_replace') {
      const [t, f] = pick(files);
      const name = f.replace(/\.md$/, '');
      res = await call(
        { command: 'str_replace', path: `/memories/${t}/${f}`, old_str: `[${name}:2]`, new_str: `[${name}:2] revised ${k}` },
        'The memory file has been edited.',
      );
    } else if (cmd === 'insert') {
      const [t, f] = pick(files);
      const name = f.replace(/\.md$/, '');
      res = await call(
        { command: 'insert', path: `/memories/${t}/${f}`, insert_line: 1, insert_text: `- [${name}:i${k}] inserted note ${k}\n` },
        'has been edited.',
      );
    } else if (cmd === 'rename_dir') {
      const t = pick([...topics.keys()]);
      const nt = `${t.replace(/-r\d+$/, '')}-r${renamed++}`;
      res = await call(
        { command: 'rename', old_path: `/memories/${t}`, new_path: `/memories/${nt}` },
        'Successfully renamed',
      );
      topics.set(nt, topics.get(t));
      topics.delete(t);
    } else if (cmd === 'delete') {
      const [t, f] = pick(files);
      res = await call({ command: 'delete', path: `/memories/${t}/${f}` }, 'Successfully deleted');
      const fs = topics.get(t);
      fs.splice(fs.indexOf(f), 1);
    }
    byCommand[cmd].push(res.ms);
  }
  const totalS = (performance.now() - t0) / 1000;
  process.stdout.write(JSON.stringify({ total_s: totalS, by_command: byCommand, entries: countEntries() }) + '\n');
} else {
  fail(`unknown mode ${mode}`);
}
