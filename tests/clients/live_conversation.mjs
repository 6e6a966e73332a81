// One real conversation through the SDK's tool runner with the stock memory tool, for
// scripts/smoke-live (not part of the test suite: it calls the real Anthropic API and needs
// ANTHROPIC_API_KEY). `store` asks the model to save a codeword in its memory; `recall` asks a
// fresh conversation for it. Logs every memory call to stderr and prints the model's final
// text to stdout; the caller checks the files and the answer.
//
// usage: node live_conversation.mjs BASE_DIR store|recall CODEWORD
import Anthropic from '@anthropic-ai/sdk';
import { BetaLocalFilesystemMemoryTool, betaMemoryTool } from '@anthropic-ai/sdk/tools/memory/node';

const [baseDir, phase, codeword] = process.argv.slice(2);
if (!baseDir || !['store', 'recall'].includes(phase) || !codeword) {
  console.error('usage: node live_conversation.mjs BASE_DIR store|recall CODEWORD');
  process.exit(2);
}
const prompts = {
  store:
    `Please save this in your memory for future conversations: the redbfs smoke-test codeword is ${codeword}. ` +
    'Store it in a file under /memories, then reply with the single word DONE.',
  recall:
    'What is the redbfs smoke-test codeword? Look in your memory directory first, ' +
    'then answer with just the codeword.',
};

const memory = await BetaLocalFilesystemMemoryTool.init(baseDir);
const tool = betaMemoryTool(memory);
const logged = {
  ...tool,
  run: async (input) => {
    const where = input.path ?? `${input.old_path} -> ${input.new_path}`;
    try {
      const result = await tool.run(input);
      console.error(`memory ${input.command} ${where}: ok`);
      return result;
    } catch (err) {
      console.error(`memory ${input.command} ${where}: ${err.message}`);
      throw err;
    }
  },
};

const client = new Anthropic(); // ANTHROPIC_API_KEY (and ANTHROPIC_BASE_URL, if set) from the environment
const runner = client.beta.messages.toolRunner({
  model: process.env.REDBFS_SMOKE_MODEL || 'claude-sonnet-4-6',
  max_tokens: 2048,
  max_iterations: 12,
  betas: ['context-management-2025-06-27'],
  context_management: {
    edits: [{ type: 'clear_tool_uses_20250919', trigger: { type: 'input_tokens', value: 30000 } }],
  },
  system:
    'You have a persistent memory directory at /memories. ALWAYS view it before doing anything else, ' +
    'and record anything the user asks you to remember there.',
  tools: [logged],
  messages: [{ role: 'user', content: prompts[phase] }],
});
let last;
for await (const message of runner) last = message;
const text = (last?.content ?? [])
  .filter((b) => b.type === 'text')
  .map((b) => b.text)
  .join('\n');
console.error(`stop_reason: ${last?.stop_reason}`);
console.log(text);
