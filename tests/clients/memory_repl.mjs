// One memory-tool command per stdin line (the tool input as JSON), run through the stock
// TypeScript BetaLocalFilesystemMemoryTool of @anthropic-ai/sdk as the SDK's tool runner runs
// it (`runRunnableTool`); one JSON line {is_error, content} on stdout per command, at once.
// An agent that keeps its tool open while another host changes the memory under it.
//
// usage: node memory_repl.mjs BASE_DIR
import { createInterface } from 'node:readline';
import { BetaLocalFilesystemMemoryTool, betaMemoryTool } from '@anthropic-ai/sdk/tools/memory/node';
import { runRunnableTool } from '@anthropic-ai/sdk/lib/tools/BetaRunnableTool';

const [baseDir] = process.argv.slice(2);
if (!baseDir) {
  console.error('usage: node memory_repl.mjs BASE_DIR');
  process.exit(2);
}
const tool = betaMemoryTool(await BetaLocalFilesystemMemoryTool.init(baseDir));
let i = 0;
for await (const line of createInterface({ input: process.stdin })) {
  if (!line.trim()) continue;
  const input = JSON.parse(line);
  const { content, isError } = await runRunnableTool(tool, input, {
    toolUse: { type: 'tool_use', id: `toolu_repl_${i++}`, name: 'memory', input },
  });
  process.stdout.write(JSON.stringify({ is_error: isError, content }) + '\n');
}
