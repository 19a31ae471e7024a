// The official OpenAI client for Node (npm `openai`, installed by scripts/setup into the
// build tree) against `tandem serve`: tests/targets/cli_serve_test.cpp runs it as
//   NODE_PATH=BUILD/npm/node_modules node openai_client.cjs BASE_URL KEY MODEL
// and reads the one JSON line it prints: each call's text (whole and streamed), finish
// reasons, usage, the model list, and the status a wrong key gets.
const OpenAI = require('openai');

async function main() {
  const [baseURL, apiKey, model] = process.argv.slice(2);
  const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 30000 });
  const out = {};
  out.models = (await client.models.list()).data.map((m) => m.id);
  const c = await client.completions.create({ model, prompt: 'The', max_tokens: 6, temperature: 0 });
  out.completion = c.choices[0].text;
  out.finish = c.choices[0].finish_reason;
  out.usage = c.usage;
  const stream = await client.completions.create({
    model, prompt: 'The', max_tokens: 6, temperature: 0, stream: true,
  });
  out.streamed = '';
  for await (const chunk of stream) out.streamed += chunk.choices[0]?.text ?? '';
  const messages = [{ role: 'user', content: 'Hi' }];
  const chat = await client.chat.completions.create({ model, messages, max_tokens: 5, temperature: 0 });
  out.chat = chat.choices[0].message.content;
  out.chat_role = chat.choices[0].message.role;
  const chatStream = await client.chat.completions.create({
    model, messages, max_tokens: 5, temperature: 0, stream: true,
  });
  out.chat_streamed = '';
  for await (const chunk of chatStream) out.chat_streamed += chunk.choices[0]?.delta?.content ?? '';
  try {
    await new OpenAI({ baseURL, apiKey: 'wrong-key-0123456789', maxRetries: 0 }).models.list();
    out.wrong_key = 'accepted';
  } catch (e) {
    out.wrong_key = e.status;
  }
  console.log(JSON.stringify(out));
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
