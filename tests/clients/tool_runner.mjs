// End to end through the SDK's tool runner: `client.beta.messages.toolRunner` with
// `betaMemoryTool(await BetaLocalFilesystemMemoryTool.init(BASE_DIR))`, context management
// `clear_tool_uses_20250919` on (as long agent runs have it), and `baseURL` pointed at the local
// mock of the Messages API (mock_api.mjs). The mock plays a model that views, creates (two files
// in one turn, run concurrently by the runner), edits, renames a populated directory, re-reads
// and lists its memories, and checks the exact tool_result text the runner sends back for each
// call. Exits 1 if any check fails; on success prints one JSON line naming the files (relative
// to BASE_DIR) and the content each must now hold, for the caller to verify on disk.
//
// usage: node tool_runner.mjs BASE_DIR      (BASE_DIR must not hold any memories yet)
import { existsSync, readdirSync } from 'node:fs';
import path from 'node:path';
import Anthropic from '@anthropic-ai/sdk';
import { BetaLocalFilesystemMemoryTool, betaMemoryTool } from '@anthropic-ai/sdk/tools/memory/node';
import { startMockApi } from './mock_api.mjs';

const baseDir = process.argv[2];
if (!baseDir) {
  console.error('usage: node tool_runner.mjs BASE_DIR');
  process.exit(2);
}
const memoriesDir = path.join(baseDir, 'memories');
if (existsSync(memoriesDir) && readdirSync(memoriesDir).length > 0) {
  console.error(`${memoriesDir} is not empty: the scripted conversation needs a fresh store`);
  process.exit(2);
}

const API_KEY = 'sk-ant-mock-key';
const CONTEXT_BETA = 'context-management-2025-06-27';
const LIST_HEADER = (p) =>
  `Here're the files and directories up to 2 levels deep in ${p}, excluding hidden items and node_modules:`;
const numbered = (lines, start = 1) =>
  lines.map((line, i) => `${String(start + i).padStart(6, ' ')}\t${line}`).join('\n');

const NOTES = '# redbfs\nowner: memory tool\nstatus: draft\nstore: redb over FUSE\n';
const NOTES_EDITED = NOTES.replace('status: draft', 'status: working \u2705');
const DECISIONS = 'Decisions \u2014 \u65e5\u672c\u8a9e ok\n1. one transaction per op\n';

/** Problems with the tool_result for `id`: missing, wrong error flag, or text other than `text`. */
function expectResult(results, id, text, { isError = false } = {}) {
  const block = results.get(id);
  if (!block) return [`no tool_result for ${id}; got ${JSON.stringify([...results.keys()])}`];
  const problems = [];
  if ((block.is_error === true) !== isError) problems.push(`${id}: is_error is ${block.is_error}, want ${isError}`);
  if (block.content !== text) {
    problems.push(`${id}: tool_result content\n  want ${JSON.stringify(text)}\n  got  ${JSON.stringify(block.content)}`);
  }
  return problems;
}

const turns = [
  {
    expect: (results) => (results.size ? [`first request carries tool results ${[...results.keys()]}`] : []),
    reply: { text: 'Let me check my memory first.', toolUses: [{ input: { command: 'view', path: '/memories' } }] },
  },
  {
    expect: (r) => expectResult(r, 'toolu_mock_0_0', `${LIST_HEADER('/memories')}\n4K\t/memories`),
    reply: {
      toolUses: [
        { input: { command: 'create', path: '/memories/projects/redbfs/notes.md', file_text: NOTES } },
        { input: { command: 'create', path: '/memories/projects/redbfs/decisions.md', file_text: DECISIONS } },
      ],
    },
  },
  {
    expect: (r) => [
      ...expectResult(r, 'toolu_mock_1_0', 'File created successfully at: /memories/projects/redbfs/notes.md'),
      ...expectResult(r, 'toolu_mock_1_1', 'File created successfully at: /memories/projects/redbfs/decisions.md'),
    ],
    reply: {
      toolUses: [
        {
          input: {
            command: 'str_replace',
            path: '/memories/projects/redbfs/notes.md',
            old_str: 'status: draft',
            new_str: 'status: working \u2705',
          },
        },
      ],
    },
  },
  {
    expect: (r) =>
      expectResult(
        r,
        'toolu_mock_2_0',
        'The memory file has been edited. Here is the snippet showing the change (with line numbers):\n' +
          numbered(NOTES_EDITED.split('\n')),
      ),
    reply: { toolUses: [{ input: { command: 'rename', old_path: '/memories/projects', new_path: '/memories/work' } }] },
  },
  {
    expect: (r) => expectResult(r, 'toolu_mock_3_0', 'Successfully renamed /memories/projects to /memories/work'),
    reply: {
      toolUses: [
        { input: { command: 'view', path: '/memories/work/redbfs/notes.md' } },
        { input: { command: 'create', path: '/memories/work/redbfs/notes.md', file_text: 'clobber?\n' } },
      ],
    },
  },
  {
    expect: (r) => [
      ...expectResult(
        r,
        'toolu_mock_4_0',
        `Here's the content of /memories/work/redbfs/notes.md with line numbers:\n${numbered(NOTES_EDITED.split('\n'))}`,
      ),
      ...expectResult(r, 'toolu_mock_4_1', 'Error: File /memories/work/redbfs/notes.md already exists', {
        isError: true,
      }),
    ],
    reply: { toolUses: [{ input: { command: 'view', path: '/memories' } }] },
  },
  {
    expect: (r) =>
      expectResult(
        r,
        'toolu_mock_5_0',
        `${LIST_HEADER('/memories')}\n4K\t/memories\n4K\t/memories/work/\n4K\t/memories/work/redbfs/`,
      ),
    reply: { text: 'Saved your notes under /memories/work/redbfs.' },
  },
];

const contextManagement = {
  edits: [
    {
      type: 'clear_tool_uses_20250919',
      trigger: { type: 'input_tokens', value: 30000 },
      keep: { type: 'tool_uses', value: 3 },
      clear_at_least: { type: 'input_tokens', value: 5000 },
    },
  ],
};

const mock = await startMockApi({
  turns,
  apiKey: API_KEY,
  requiredBetas: [CONTEXT_BETA],
  checkRequest: (req) => {
    const problems = [];
    if (JSON.stringify(req.context_management) !== JSON.stringify(contextManagement)) {
      problems.push(`context_management is ${JSON.stringify(req.context_management)}`);
    }
    // `tools` goes out on every unthreaded turn and on the turn that creates a thread.
    if (req.thread?.type !== 'continue') {
      const memoryTools = (req.tools ?? []).filter((t) => t.type === 'memory_20250818' && t.name === 'memory');
      if (memoryTools.length !== 1) problems.push(`tools are ${JSON.stringify(req.tools)}`);
    }
    return problems;
  },
});

let exitCode = 0;
try {
  const client = new Anthropic({ apiKey: API_KEY, baseURL: mock.url, maxRetries: 0 });
  const memory = await BetaLocalFilesystemMemoryTool.init(baseDir);
  const runner = client.beta.messages.toolRunner({
    model: 'claude-sonnet-5-5',
    max_tokens: 1024,
    max_iterations: turns.length + 2,
    betas: [CONTEXT_BETA],
    context_management: contextManagement,
    tools: [betaMemoryTool(memory)],
    messages: [{ role: 'user', content: 'Remember the redbfs project notes for later.' }],
  });
  let last;
  for await (const message of runner) last = message;

  if (mock.turnsServed() !== turns.length) {
    mock.failures.push(`the runner made ${mock.turnsServed()} requests, the script has ${turns.length} turns`);
  }
  if (last?.stop_reason !== 'end_turn') mock.failures.push(`last stop_reason is ${last?.stop_reason}`);
  if (mock.failures.length) {
    console.error(`tool runner checks failed:\n- ${mock.failures.join('\n- ')}`);
    exitCode = 1;
  } else {
    console.log(
      JSON.stringify({
        turns: mock.turnsServed(),
        threaded: mock.requests.some((r) => r.thread),
        files: {
          'memories/work/redbfs/notes.md': NOTES_EDITED,
          'memories/work/redbfs/decisions.md': DECISIONS,
        },
        absent: ['memories/projects'],
      }),
    );
  }
} catch (err) {
  console.error('tool runner failed:', err);
  if (mock.failures.length) console.error(`- ${mock.failures.join('\n- ')}`);
  exitCode = 1;
} finally {
  await mock.close();
}
process.exit(exitCode);
