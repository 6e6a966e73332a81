// Runs a scripted memory-tool session (session.json) through the stock TypeScript
// BetaLocalFilesystemMemoryTool of @anthropic-ai/sdk, the way the SDK's tool runner calls it:
// `betaMemoryTool(await BetaLocalFilesystemMemoryTool.init(BASE_DIR))` run through the SDK's own
// `runRunnableTool`, which turns a thrown error into the `Error: <message>` result the model reads.
// Prints one JSON line per command: {i, note, command, is_error, content}, with the absolute
// base path masked as <ROOT> so runs in different directories compare byte for byte.
//
// usage: node run_session.mjs BASE_DIR SESSION_JSON
import { readFileSync, realpathSync } from 'node:fs';
import path from 'node:path';
import { BetaLocalFilesystemMemoryTool, betaMemoryTool } from '@anthropic-ai/sdk/tools/memory/node';
import { runRunnableTool } from '@anthropic-ai/sdk/lib/tools/BetaRunnableTool';
import { expandInput, maskPaths } from './session_lib.mjs';

const [baseDir, sessionFile] = process.argv.slice(2);
if (!baseDir || !sessionFile) {
  console.error('usage: node run_session.mjs BASE_DIR SESSION_JSON');
  process.exit(2);
}
const session = JSON.parse(readFileSync(sessionFile, 'utf-8'));
const tool = betaMemoryTool(await BetaLocalFilesystemMemoryTool.init(baseDir));
const mask = maskPaths([baseDir, path.resolve(baseDir), realpathSync(baseDir)]);

for (const [i, step] of session.entries()) {
  const input = expandInput(step.input);
  const { content, isError } = await runRunnableTool(tool, input, {
    toolUse: { type: 'tool_use', id: `toolu_session_${i}`, name: 'memory', input },
  });
  process.stdout.write(
    JSON.stringify({ i, note: step.note, command: input.command, is_error: isError, content: mask(content) }) + '\n',
  );
}
