// Several agents editing one memory at once through the stock TypeScript
// BetaLocalFilesystemMemoryTool of @anthropic-ai/sdk, each command run through the SDK's own
// `runRunnableTool` as the tool runner does. Each agent makes EDITS edits: even ones insert
// the line `<agent>-insert-<i>` after line 1, odd ones str_replace `slot-<agent>-<i>: empty`
// with `slot-<agent>-<i>: done`. A refusal for a lost update (EAGAIN) is retried as a model
// would: the same command again, which re-reads the file. Prints one JSON line:
// {ok, refusals, vanished, errors}, `vanished` counting "no longer exists" results.
//
// usage: node agents_edit.mjs BASE_DIR MEMORY_PATH EDITS AGENT [AGENT...]
//   (several AGENTs: that many async agents in this one process)
import { BetaLocalFilesystemMemoryTool, betaMemoryTool } from '@anthropic-ai/sdk/tools/memory/node';
import { runRunnableTool } from '@anthropic-ai/sdk/lib/tools/BetaRunnableTool';

const [baseDir, memoryPath, editsArg, ...agents] = process.argv.slice(2);
if (!baseDir || !memoryPath || !editsArg || agents.length === 0) {
  console.error('usage: node agents_edit.mjs BASE_DIR MEMORY_PATH EDITS AGENT [AGENT...]');
  process.exit(2);
}
const edits = Number(editsArg);
const tool = betaMemoryTool(await BetaLocalFilesystemMemoryTool.init(baseDir));
const tally = { ok: 0, refusals: 0, vanished: 0, errors: [] };

function commandFor(agent, i) {
  return i % 2 === 0
    ? { command: 'insert', path: memoryPath, insert_line: 1, insert_text: `${agent}-insert-${i}` }
    : { command: 'str_replace', path: memoryPath, old_str: `slot-${agent}-${i}: empty`, new_str: `slot-${agent}-${i}: done` };
}

async function agent(name) {
  for (let i = 0; i < edits; i++) {
    const input = commandFor(name, i);
    for (let attempt = 0; ; attempt++) {
      const { content, isError } = await runRunnableTool(tool, input, {
        toolUse: { type: 'tool_use', id: `toolu_${name}_${i}_${attempt}`, name: 'memory', input },
      });
      const text = typeof content === 'string' ? content : JSON.stringify(content);
      if (!isError) {
        tally.ok++;
        break;
      }
      if (text.includes('no longer exists')) tally.vanished++;
      if (text.includes('EAGAIN') && attempt < 200) {
        tally.refusals++;
        continue;
      }
      tally.errors.push(text);
      break;
    }
  }
}

await Promise.all(agents.map(agent));
process.stdout.write(JSON.stringify(tally) + '\n');
