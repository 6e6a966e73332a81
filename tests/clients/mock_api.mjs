// A scripted mock of the Anthropic Messages API on 127.0.0.1 (random free port), for driving
// the SDK's tool runner without a network. Each turn of the script checks the request it gets
// (the tool_result blocks answering the previous turn's tool_use blocks, the memory tool
// definition, context management, the message-thread fields the stock client sends) and
// replies with the next scripted assistant message. Every failed check is recorded in
// `failures`; the caller exits non-zero when there is any.
import http from 'node:http';

const MESSAGE_THREADS_BETA = 'message-threads-2026-08-12';

/**
 * Starts the mock. `turns` is a list of `{ expect, reply }`: `expect(results, request)` returns a
 * list of problems found in the `tool_result` blocks of the request (keyed by tool_use id) and
 * `reply` is `{ toolUses: [{ input }], text }`; a turn without tool uses ends the conversation.
 */
export async function startMockApi({ turns, apiKey, requiredBetas = [], checkRequest = () => [] }) {
  const failures = [];
  const requests = [];
  let turn = 0;
  let lastReplyId = null;
  const fail = (msg) => failures.push(`turn ${turn}: ${msg}`);

  const server = http.createServer((req, res) => {
    let body = '';
    req.setEncoding('utf8');
    req.on('data', (chunk) => (body += chunk));
    req.on('end', () => {
      const send = (status, obj) => {
        res.writeHead(status, { 'content-type': 'application/json', 'request-id': `req_mock_${requests.length}` });
        res.end(JSON.stringify(obj));
      };
      if (req.method !== 'POST' || !req.url.startsWith('/v1/messages')) {
        fail(`unexpected request ${req.method} ${req.url}`);
        return send(404, { type: 'error', error: { type: 'not_found_error', message: `no route ${req.url}` } });
      }
      let request;
      try {
        request = JSON.parse(body);
      } catch (e) {
        fail(`request body is not JSON: ${e}`);
        return send(400, { type: 'error', error: { type: 'invalid_request_error', message: 'bad json' } });
      }
      requests.push(request);
      // This SDK sends an API key as `Authorization: Bearer`; older ones used `x-api-key`.
      const auth = req.headers['x-api-key'] ?? String(req.headers.authorization ?? '').replace(/^Bearer /, '');
      if (auth !== apiKey) fail(`request carries no API key ${apiKey}: ${JSON.stringify(req.headers)}`);
      const betas = String(req.headers['anthropic-beta'] ?? '').split(',').map((s) => s.trim());
      for (const beta of requiredBetas) {
        if (!betas.includes(beta)) fail(`anthropic-beta header ${JSON.stringify(req.headers['anthropic-beta'])} lacks ${beta}`);
      }
      for (const problem of checkRequest(request)) fail(problem);
      // The stock client threads its turns: the first creates a thread with the whole history, later
      // ones continue from the previous reply's id and send only the new messages. Both are checked.
      if (request.thread) {
        if (!betas.includes(MESSAGE_THREADS_BETA)) fail(`thread field sent without the ${MESSAGE_THREADS_BETA} beta`);
        if (turn === 0 && request.thread.type !== 'create') fail(`first turn thread is ${JSON.stringify(request.thread)}`);
        if (turn > 0 && (request.thread.type !== 'continue' || request.thread.previous_message_id !== lastReplyId)) {
          fail(`thread ${JSON.stringify(request.thread)} does not continue from ${lastReplyId}`);
        }
      }

      const script = turns[turn];
      if (!script) {
        fail('request after the script ended');
        return send(400, { type: 'error', error: { type: 'invalid_request_error', message: 'script ended' } });
      }
      const results = new Map();
      const last = request.messages.at(-1);
      if (last?.role === 'user' && Array.isArray(last.content)) {
        for (const block of last.content) {
          if (block.type === 'tool_result') results.set(block.tool_use_id, block);
        }
      }
      for (const problem of script.expect(results, request)) fail(problem);

      const id = `msg_mock_${String(turn).padStart(2, '0')}`;
      const content = [];
      if (script.reply.text) content.push({ type: 'text', text: script.reply.text });
      for (const [k, use] of (script.reply.toolUses ?? []).entries()) {
        content.push({ type: 'tool_use', id: `toolu_mock_${turn}_${k}`, name: 'memory', input: use.input });
      }
      // A failed check ends the conversation at once, so the runner stops and reports it.
      const toolTurn = failures.length === 0 && content.some((b) => b.type === 'tool_use');
      lastReplyId = id;
      turn += 1;
      send(200, {
        id,
        type: 'message',
        role: 'assistant',
        model: request.model,
        content: toolTurn ? content : [{ type: 'text', text: failures.length ? 'stopping: a check failed' : script.reply.text ?? '' }],
        stop_reason: toolTurn ? 'tool_use' : 'end_turn',
        stop_sequence: null,
        usage: { input_tokens: 100 + turn, output_tokens: 10 },
        context_management: { applied_edits: [] },
      });
    });
  });
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address();
  return {
    url: `http://127.0.0.1:${port}`,
    failures,
    requests,
    turnsServed: () => turn,
    close: () => new Promise((resolve) => server.close(resolve)),
  };
}
