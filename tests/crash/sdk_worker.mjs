// Workload processes that go through the stock memory tool of @anthropic-ai/sdk 1.14.0
// (`BetaLocalFilesystemMemoryTool`, installed in tests/clients by setup.sh), for
// tests/crash.rs and tests/durability.rs. Same arguments and journal as worker.py (see there):
//
//   node sdk_worker.mjs '{"mode":..., "mount":..., "root":"memories/c0", "journal":..., "seed":N, "tag":...}'
//
// modes: create (SDK create loop), rev (SDK str_replace loop on one file), rmtree (files made
// with SDK create, directories deleted with SDK delete), soak-writer, soak-reader.
//
// Each tool command is one journaled operation: its intent before the call, its
// acknowledgement after the call returned. A command that returns an error string (the SDK
// throws) is journaled as failed with whether the mount was gone at that point.
import { openSync, writeSync, fsyncSync, readFileSync, mkdirSync, readdirSync } from 'node:fs';

const cfg = JSON.parse(process.argv[2]);
const sdkUrl = new URL('../clients/node_modules/@anthropic-ai/sdk/tools/memory/node.mjs', import.meta.url);
const { BetaLocalFilesystemMemoryTool } = await import(sdkUrl.href);

const FILL = 'abcdefghijklmnopqrstuvwxyz0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ+/';
const SLOW_MS = 30000; // a hang detector, not a speed bound

/** The content generator shared with worker.py and model.rs. */
export function content(cid, size, rev = 0) {
  const parts = [`#${cid} ${size} rev=${String(rev).padStart(4, '0')}\n`];
  let total = parts[0].length;
  for (let i = 0; total < size; i++) {
    const p = `${cid}:${i}|`;
    const line = p + FILL.slice(0, Math.max(0, 63 - p.length)) + '\n';
    parts.push(line);
    total += line.length;
  }
  return parts.join('').slice(0, size);
}

// mulberry32 over the low 32 bits of the seed.
function rng(seed) {
  let a = Number(BigInt(seed) & 0xffffffffn) >>> 0;
  const next = () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
  return {
    random: next,
    int: (lo, hi) => lo + Math.floor(next() * (hi - lo + 1)),
    choice: (xs) => xs[Math.floor(next() * xs.length)],
  };
}

const R = rng(cfg.seed);
const jfd = openSync(cfg.journal, 'a');
const rec = (obj) => {
  writeSync(jfd, JSON.stringify(obj) + '\n');
  fsyncSync(jfd);
};
const mount = cfg.mount;
const soak = cfg.mode.startsWith('soak');
const deadline = Date.now() + 1000 * (cfg.secs ?? 0);
const keepGoing = () => (soak ? Date.now() < deadline : true);
const mem = (rel) => '/' + rel; // "memories/c0/x.md" -> "/memories/c0/x.md", the model's path
let seq = 0;
let ops = 0;
let maxMs = 0;

class Stop extends Error {}

const DEAD = ['ENOTCONN', 'ECONNABORTED'];
/** Whether the mount is gone (the daemon was killed): the error says so, or a readdir of the
 * mount root (a stat may be answered from the kernel's attribute cache) fails so. */
function dead(e) {
  if (e && DEAD.includes(e.code)) return true;
  try {
    readdirSync(mount);
    return false;
  } catch (e2) {
    return DEAD.includes(e2.code);
  }
}

/** One tool command, journaled and timed (the liveness bound holds per command here). */
async function op(desc, fn, { benign } = {}) {
  seq += 1;
  const s = seq;
  if (desc) rec({ b: s, ...desc });
  const t0 = performance.now();
  let result;
  try {
    result = await fn();
  } catch (e) {
    const ms = performance.now() - t0;
    if (ms > SLOW_MS) rec({ slow: desc?.op ?? 'read', ms });
    if (benign && benign(e)) return null;
    rec({ f: desc ? s : 0, errno: e.code ?? null, msg: String(e.message ?? e), dead: dead(e) });
    throw new Stop();
  }
  const ms = performance.now() - t0;
  maxMs = Math.max(maxMs, ms);
  if (ms > SLOW_MS) rec({ slow: desc?.op ?? 'read', ms });
  if (desc) rec({ a: s });
  ops += 1;
  return result;
}

const tool = await BetaLocalFilesystemMemoryTool.init(mount);
const size = () => {
  const r = R.random();
  if (r < 0.8) return R.int(64, 4000);
  if (r < 0.97) return R.int(4000, 150000);
  return R.int(520000, 700000);
};
const cid = (n) => `${cfg.root.replaceAll('/', '_')}.${cfg.tag}.${n}`;

async function create(rel, c, sz) {
  await op({ op: 'write', path: rel, cid: c, size: sz, rev: 0, points: [sz], excl: true }, () =>
    tool.create({ command: 'create', path: mem(rel), file_text: content(c, sz) }),
  );
}

function headerRev(rel) {
  const text = readFileSync(`${mount}/${rel}`, { encoding: 'latin1' }).slice(0, 200);
  const m = /^#\S+ \d+ rev=(\d{4})\n/.exec(text);
  if (!m) throw Object.assign(new Error(`no content header in ${rel}: ${JSON.stringify(text.slice(0, 60))}`), { code: 'EBADMSG' });
  return Number(m[1]);
}

async function bumpRev(rel) {
  let from;
  try {
    from = headerRev(rel);
  } catch (e) {
    rec({ f: 0, errno: e.code ?? null, msg: String(e.message), dead: dead(e) });
    throw new Stop();
  }
  const to = (from + 1) % 10000;
  const pad = (n) => String(n).padStart(4, '0');
  await op({ op: 'rev', path: rel, from, to }, () =>
    tool.str_replace({ command: 'str_replace', path: mem(rel), old_str: `rev=${pad(from)}`, new_str: `rev=${pad(to)}` }),
  );
}

const modes = {
  // Many memories created through the SDK.
  async create() {
    for (let n = 1; ; n++) await create(`${cfg.root}/${cfg.tag}-${n}.md`, cid(n), size());
  },

  // str_replace loops through the SDK on the files of this root (made by the test).
  async rev() {
    const files = cfg.extra.files.map((f) => `${cfg.root}/${f}`);
    for (;;) await bumpRev(R.choice(files));
  },

  // Directories of SDK-created files, deleted with the SDK's delete (fs.rm recursive: it
  // removes children concurrently, so a kill may leave any part of the tree).
  async rmtree() {
    // The listing goes through op() too: a kill in the first moments fails it like any call.
    const start = await op(null, async () => readdirSync(`${mount}/${cfg.root}`));
    for (const name of start) {
      await op({ op: 'rmtree', path: `${cfg.root}/${name}` }, () => tool.delete({ command: 'delete', path: mem(`${cfg.root}/${name}`) }));
    }
    for (let n = 1; ; n++) {
      const top = `${cfg.root}/${cfg.tag}-${n}`;
      await op({ op: 'mkdir', path: top }, async () => mkdirSync(`${mount}/${top}`, { mode: 0o700 }));
      for (let d = 0, nd = R.int(1, 3); d < nd; d++) {
        const sub = `${top}/s${d}`;
        await op({ op: 'mkdir', path: sub }, async () => mkdirSync(`${mount}/${sub}`, { mode: 0o700 }));
        for (let f = 0, nf = R.int(1, 5); f < nf; f++) await create(`${sub}/f${f}.md`, cid(`${n}.${d}.${f}`), R.int(64, 3000));
      }
      await op({ op: 'rmtree', path: top }, () => tool.delete({ command: 'delete', path: mem(top) }));
    }
  },

  // A writer of the concurrency soak, in its own directory, through the SDK only.
  async 'soak-writer'() {
    await op({ op: 'mkdir', path: cfg.root }, async () => mkdirSync(`${mount}/${cfg.root}`, { mode: 0o700 }));
    const files = [];
    const subdirs = [];
    for (let n = 1; keepGoing(); n++) {
      const r = R.random();
      if (r < 0.35 || files.length < 3) {
        const d = R.choice([cfg.root, ...subdirs]);
        const rel = `${d}/m${n}.md`;
        await create(rel, cid(n), size());
        files.push(rel);
      } else if (r < 0.6) {
        await bumpRev(R.choice(files));
      } else if (r < 0.72) {
        const t = files.splice(Math.floor(R.random() * files.length), 1)[0];
        await op({ op: 'rmtree', path: t }, () => tool.delete({ command: 'delete', path: mem(t) }));
      } else if (r < 0.82) {
        const i = Math.floor(R.random() * files.length);
        const d = R.choice([cfg.root, ...subdirs]);
        const to = `${d}/r${n}.md`;
        await op({ op: 'rename', from: files[i], to }, () =>
          tool.rename({ command: 'rename', old_path: mem(files[i]), new_path: mem(to) }),
        );
        files[i] = to;
      } else if (r < 0.88 && subdirs.length < 4) {
        const d = `${cfg.root}/d${n}`;
        await op({ op: 'mkdir', path: d }, async () => mkdirSync(`${mount}/${d}`, { mode: 0o700 }));
        subdirs.push(d);
      } else if (r < 0.92 && subdirs.length) {
        const d = subdirs.splice(Math.floor(R.random() * subdirs.length), 1)[0];
        for (let i = files.length - 1; i >= 0; i--) if (files[i].startsWith(d + '/')) files.splice(i, 1);
        await op({ op: 'rmtree', path: d }, () => tool.delete({ command: 'delete', path: mem(d) }));
      } else {
        await op(null, () => tool.view({ command: 'view', path: mem(R.choice(files)) }));
      }
    }
  },

  // A reader of the concurrency soak: the SDK's view of /memories (two levels, a stat per
  // entry), then views of files it listed. Paths that vanish under it are normal.
  async 'soak-reader'() {
    const gone = (e) => /does not exist|no longer exists/.test(String(e.message)) || e.code === 'ENOENT';
    while (keepGoing()) {
      const listing = await op(null, () => tool.view({ command: 'view', path: '/memories' }), { benign: gone });
      if (!listing) continue;
      const files = listing
        .split('\n')
        .slice(2)
        .map((l) => l.split('\t')[1])
        .filter((p) => p && !p.endsWith('/'));
      for (let i = 0; i < 5 && files.length && keepGoing(); i++) {
        const p = R.choice(files);
        const out = await op(null, () => tool.view({ command: 'view', path: p }), { benign: gone });
        if (out === null) continue;
        // The content the model reads must be a whole, self-consistent file.
        const text = out
          .split('\n')
          .slice(1)
          .map((l) => l.slice(l.indexOf('\t') + 1))
          .join('\n');
        const m = /^#(\S+) (\d+) rev=(\d{4})\n/.exec(text);
        if (!m) {
          rec({ bad: p, why: `no content header: ${JSON.stringify(text.slice(0, 80))}` });
          continue;
        }
        const want = content(m[1], Number(m[2]), Number(m[3]));
        if (!want.startsWith(text)) rec({ bad: p, why: `view shows ${text.length} bytes that are not a prefix of content(${m[1]})` });
      }
    }
  },
};

rec({ ready: true, pid: process.pid });
let code = 0;
try {
  await modes[cfg.mode]();
} catch (e) {
  if (!(e instanceof Stop)) {
    rec({ f: 0, errno: e.code ?? null, msg: String(e.stack ?? e), dead: dead(e) });
    code = 1;
  } else {
    code = soak ? 1 : 0;
  }
}
if (code === 0 && soak) rec({ done: true, ops, max_ms: maxMs });
process.exit(code);
