// Talks to a running `depcache serve` with the official OpenAI Node client,
// as an application would, and prints what it got as one JSON object:
//   node openai_check.mjs BASE_URL MODEL API_KEY PROMPT MAX_TOKENS
// Greedy (temperature 0) completions and chat, each whole and streamed; a
// completion whose context comes in the RAG extension, sent twice; and the
// errors the client raises for a wrong key and an unknown model.
//   node openai_check.mjs BASE_URL MODEL API_KEY PROMPT MAX_TOKENS sampling TOKEN_ID STOP
// Instead: logprobs (completions: logprobs N; chat: logprobs, top_logprobs,
// whole and streamed), penalties, a logit bias of +100 on TOKEN_ID, a stop
// string, and JSON mode, which the server refuses.
import OpenAI from 'openai';

const [baseURL, model, apiKey, prompt, maxTokensArg, mode, tokenId, stop] = process.argv.slice(2);
const maxTokens = Number(maxTokensArg);
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 120000 });
const out = {};

if (mode === 'sampling') {
  const greedy = { model, max_tokens: maxTokens, temperature: 0 };
  const completion = await client.completions.create({ ...greedy, prompt, logprobs: 3 });
  out.completion = completion.choices[0].text;
  out.completion_logprobs = completion.choices[0].logprobs;

  const messages = [{ role: 'user', content: prompt }];
  const asked = { ...greedy, messages, logprobs: true, top_logprobs: 2 };
  const chat = await client.chat.completions.create(asked);
  out.chat = chat.choices[0].message.content;
  out.chat_logprobs = chat.choices[0].logprobs.content;
  const streamed = [];
  for await (const chunk of await client.chat.completions.create({ ...asked, stream: true }))
    streamed.push(...(chunk.choices[0]?.logprobs?.content ?? []));
  out.chat_streamed_logprobs = streamed;

  const penalized = await client.chat.completions.create({
    ...greedy, messages, presence_penalty: 0.5, frequency_penalty: 1.5,
  });
  out.penalized = penalized.choices[0].message.content;
  const biased = await client.completions.create({
    model, prompt, max_tokens: 4, temperature: 1, seed: 7, logit_bias: { [tokenId]: 100 },
  });
  out.biased = biased.choices[0].text;
  const stopped = await client.completions.create({ ...greedy, prompt, stop: [stop] });
  out.stopped = stopped.choices[0].text;
  out.stopped_reason = stopped.choices[0].finish_reason;
  try {
    await client.chat.completions.create({ ...greedy, messages, response_format: { type: 'json_object' } });
    out.json_mode = { status: 200 };
  } catch (e) {
    out.json_mode = { status: e.status, param: e.param ?? e.error?.param };
  }
  console.log(JSON.stringify(out));
  process.exit(0);
}

const completion = await client.completions.create({ model, prompt, max_tokens: maxTokens, temperature: 0 });
out.completion = completion.choices[0].text;
out.completion_usage = completion.usage;

let streamed = '';
let streamedUsage = null;
const stream = await client.completions.create({
  model, prompt, max_tokens: maxTokens, temperature: 0, stream: true,
  stream_options: { include_usage: true },
});
for await (const chunk of stream) {
  if (chunk.choices?.length) streamed += chunk.choices[0].text;
  if (chunk.usage) streamedUsage = chunk.usage;
}
out.completion_streamed = streamed;
out.completion_streamed_usage = streamedUsage;

const messages = [
  { role: 'system', content: 'You tell short stories.' },
  { role: 'user', content: prompt },
];
const chat = await client.chat.completions.create({ model, messages, max_tokens: maxTokens, temperature: 0 });
out.chat = chat.choices[0].message.content;
out.chat_role = chat.choices[0].message.role;

let chatStreamed = '';
const chatStream = await client.chat.completions.create({
  model, messages, max_tokens: maxTokens, temperature: 0, stream: true,
});
for await (const chunk of chatStream) chatStreamed += chunk.choices[0]?.delta?.content ?? '';
out.chat_streamed = chatStreamed;

// The RAG extension rides in the body next to the OpenAI fields.
const rag = {
  strategy: 'prefix',
  documents: [
    { id: 'lake', title: 'The lake', text: 'The robot found three shells by the lake.' },
    { id: 'tree', title: 'The tree', text: 'An old tree stood beside the path home.' },
  ],
};
const ragRequest = { model, prompt: 'What did the robot find?', max_tokens: 2, temperature: 0, rag };
await client.completions.create(ragRequest);
out.rag_usage = (await client.completions.create(ragRequest)).usage;

for (const [name, request] of [
  ['wrong_key', () => new OpenAI({ baseURL, apiKey: 'wrong', maxRetries: 0 })
    .completions.create({ model, prompt, max_tokens: 1 })],
  ['unknown_model', () => client.completions.create({ model: 'no-such-model', prompt, max_tokens: 1 })],
]) {
  try {
    await request();
    out[name] = { status: 200 };
  } catch (e) {
    out[name] = { status: e.status, message: e.error?.message ?? e.message };
  }
}

console.log(JSON.stringify(out));
