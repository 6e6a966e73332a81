// Many users on one mount, each with its own stock TypeScript BetaLocalFilesystemMemoryTool of
// @anthropic-ai/sdk (base path USERS_DIR/<user>), all as async agents in this one process, each
// command run through the SDK's own `runRunnableTool` as the tool runner does. Each user creates
// FILES memories of about BYTES bytes, then makes one str_replace and one view. The HOG user has
// a small quota: the others write their second half only once the hog has been refused, so they
// keep writing while it is over its quota. Prints one JSON line: user -> {ok, errors}.
//
// usage: node users.mjs USERS_DIR FILES BYTES HOG USER...
import { BetaLocalFilesystemMemoryTool, betaMemoryTool } from '@anthropic-ai/sdk/tools/memory/node';
import { runRunnableTool } from '@anthropic-ai/sdk/lib/tools/BetaRunnableTool';

const [usersDir, filesArg, bytesArg, hog, ...users] = process.argv.slice(2);
if (!usersDir || !filesArg || !bytesArg || !hog || users.length === 0) {
  console.error('usage: node users.mjs USERS_DIR FILES BYTES HOG USER...');
  process.exit(2);
}
const files = Number(filesArg);
const bytes = Number(bytesArg);
let hogRefused;
const hogWasRefused = new Promise((resolve) => (hogRefused = resolve));
const report = {};

async function user(name) {
  const tool = betaMemoryTool(await BetaLocalFilesystemMemoryTool.init(`${usersDir}/${name}`));
  const r = { ok: 0, errors: [] };
  report[name] = r;
  let n = 0;
  const run = async (input) => {
    const { content, isError } = await runRunnableTool(tool, input, {
      toolUse: { type: 'tool_use', id: `toolu_${name}_${n++}`, name: 'memory', input },
    });
    const text = typeof content === 'string' ? content : JSON.stringify(content);
    if (isError) {
      r.errors.push(text);
      if (name === hog) hogRefused();
    } else {
      r.ok++;
    }
  };
  for (let i = 0; i < files; i++) {
    if (name !== hog && i === Math.floor(files / 2)) await hogWasRefused;
    await run({ command: 'create', path: `/memories/note-${i}.md`, file_text: `${name} note ${i}\n${'x'.repeat(bytes)}\n` });
  }
  await run({ command: 'str_replace', path: '/memories/note-0.md', old_str: `${name} note 0`, new_str: `${name} note zero` });
  await run({ command: 'view', path: '/memories' });
  // Never leave the others waiting, whatever happened to the hog.
  if (name === hog) hogRefused();
}

await Promise.all(users.map(user));
process.stdout.write(JSON.stringify(report) + '\n');
