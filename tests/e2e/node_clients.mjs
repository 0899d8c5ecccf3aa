// Real Node clients, each in its default configuration apart from the base URL, reporting
// what the application sees: the text, the tool calls with their arguments and the reasoning
// where the client exposes it. Driven by tests/e2e/test_clients_node.py: a JSON list of cases
// on stdin, one JSON line per case on stdout (one Node start-up for all of them).
//
// A case: {id, client, model, scenario?, tools: bool, baseURL}. Clients:
//   node-chat-create      openai-node chat.completions.create({stream: true}), deltas folded
//   node-chat-helper      openai-node chat.completions.stream() + finalChatCompletion()
//   node-chat-runtools    openai-node chat.completions.runTools(): the tool runs, a second turn
//   node-responses-create openai-node responses.create({stream: true}), events folded
//   node-responses-helper openai-node responses.stream() + finalResponse()
//   ai-chat               the AI SDK's streamText with openai.chat(model)
//   ai-responses          the AI SDK's streamText with openai.responses(model)
//   node-chat-json, node-responses-json, ai-chat-json, ai-responses-json: the same without
//                         streaming (create() without stream; the AI SDK's generateText)
// The AI SDK has no refusal of its own: it shows a refusal as text.
import OpenAI from "openai";
import { generateText, jsonSchema, streamText, tool } from "ai";
import { createOpenAI } from "@ai-sdk/openai";

const PROMPT = "What is the weather in Paris?";
const PARAMETERS = {
  type: "object",
  properties: { city: { type: "string" } },
  required: ["city"],
  additionalProperties: false,
};
const CHAT_TOOLS = [
  { type: "function", function: { name: "lookup", description: "Weather", parameters: PARAMETERS } },
];
const RESPONSES_TOOLS = [
  { type: "function", name: "lookup", description: "Weather", parameters: PARAMETERS, strict: false },
];

function headers(scenario) {
  return scenario ? { "x-fake-scenario": scenario } : {};
}

function openaiNode(c) {
  return new OpenAI({
    baseURL: c.baseURL,
    apiKey: "sk-node",
    maxRetries: 0,
    timeout: 20000,
    defaultHeaders: headers(c.scenario),
  });
}

const messages = () => [{ role: "user", content: PROMPT }];

async function nodeChatCreate(c) {
  const stream = await openaiNode(c).chat.completions.create({
    model: c.model,
    messages: messages(),
    stream: true,
    ...(c.tools ? { tools: CHAT_TOOLS } : {}),
  });
  let text = "";
  let reasoning = "";
  let refusal = "";
  const calls = [];
  for await (const chunk of stream) {
    const delta = chunk.choices[0]?.delta ?? {};
    text += delta.content ?? "";
    refusal += delta.refusal ?? "";
    reasoning += delta.reasoning_content ?? delta.reasoning ?? "";
    for (const call of delta.tool_calls ?? []) {
      calls[call.index] ??= { name: "", arguments: "" };
      calls[call.index].name += call.function?.name ?? "";
      calls[call.index].arguments += call.function?.arguments ?? "";
    }
  }
  return { text, reasoning, refusal, calls };
}

async function nodeChatHelper(c) {
  const stream = openaiNode(c).chat.completions.stream({
    model: c.model,
    messages: messages(),
    ...(c.tools ? { tools: CHAT_TOOLS } : {}),
  });
  const final = await stream.finalChatCompletion();
  const message = final.choices[0].message;
  return {
    text: message.content ?? "",
    // What the helper keeps of a delta field it does not know (the point 5).
    reasoning: message.reasoning_content ?? message.reasoning ?? "",
    refusal: message.refusal ?? "",
    calls: (message.tool_calls ?? []).map((call) => ({
      name: call.function.name,
      arguments: call.function.arguments,
    })),
  };
}

async function nodeChatRunTools(c) {
  const ran = [];
  const runner = openaiNode(c).chat.completions.runTools({
    model: c.model,
    messages: messages(),
    stream: true,
    tools: [
      {
        type: "function",
        function: {
          name: "lookup",
          description: "Weather",
          parameters: PARAMETERS,
          parse: JSON.parse,
          function: (args) => {
            ran.push({ name: "lookup", arguments: JSON.stringify(args) });
            return "sunny";
          },
        },
      },
    ],
  });
  const text = await runner.finalContent();
  return { text: text ?? "", reasoning: "", calls: ran };
}

async function nodeChatJson(c) {
  const completion = await openaiNode(c).chat.completions.create({
    model: c.model,
    messages: messages(),
    ...(c.tools ? { tools: CHAT_TOOLS } : {}),
  });
  const message = completion.choices[0].message;
  return {
    text: message.content ?? "",
    reasoning: message.reasoning_content ?? message.reasoning ?? "",
    refusal: message.refusal ?? "",
    calls: (message.tool_calls ?? []).map((call) => ({
      name: call.function.name,
      arguments: call.function.arguments,
    })),
  };
}

function responseView(response) {
  const reasoning = response.output
    .filter((item) => item.type === "reasoning")
    .flatMap((item) => item.summary.map((part) => part.text))
    .join("");
  const calls = response.output
    .filter((item) => item.type === "function_call")
    .map((item) => ({ name: item.name, arguments: item.arguments }));
  const refusal = response.output
    .filter((item) => item.type === "message")
    .flatMap((item) => item.content.filter((part) => part.type === "refusal"))
    .map((part) => part.refusal)
    .join("");
  return { text: response.output_text, reasoning, refusal, calls, status: response.status };
}

async function nodeResponsesJson(c) {
  return responseView(await openaiNode(c).responses.create(responsesRequest(c)));
}

function responsesRequest(c) {
  return { model: c.model, input: PROMPT, ...(c.tools ? { tools: RESPONSES_TOOLS } : {}) };
}

async function nodeResponsesCreate(c) {
  const stream = await openaiNode(c).responses.create({ ...responsesRequest(c), stream: true });
  let text = "";
  let reasoning = "";
  let refusal = "";
  const calls = [];
  let status = null;
  for await (const event of stream) {
    if (event.type === "response.output_text.delta") text += event.delta;
    if (event.type === "response.refusal.delta") refusal += event.delta;
    if (event.type === "response.reasoning_summary_text.delta") reasoning += event.delta;
    if (event.type === "response.output_item.done" && event.item.type === "function_call") {
      calls.push({ name: event.item.name, arguments: event.item.arguments });
    }
    if (event.type === "response.completed") status = event.response.status;
  }
  return { text, reasoning, refusal, calls, status };
}

async function nodeResponsesHelper(c) {
  const stream = openaiNode(c).responses.stream(responsesRequest(c));
  return responseView(await stream.finalResponse());
}

function aiModel(c, kind) {
  const openai = createOpenAI({ baseURL: c.baseURL, apiKey: "sk-ai", headers: headers(c.scenario) });
  return kind === "chat" ? openai.chat(c.model) : openai.responses(c.model);
}

function aiTools(c) {
  return c.tools
    ? { lookup: tool({ description: "Weather", inputSchema: jsonSchema(PARAMETERS) }) }
    : undefined;
}

async function aiSdkJson(c, kind) {
  const result = await generateText({
    model: aiModel(c, kind),
    prompt: PROMPT,
    tools: aiTools(c),
    maxRetries: 0,
  });
  return {
    text: result.text,
    reasoning: result.reasoningText ?? "",
    calls: result.toolCalls.map((call) => ({
      name: call.toolName,
      arguments: JSON.stringify(call.input),
    })),
    finish: result.finishReason,
  };
}

async function aiSdk(c, kind) {
  const errors = [];
  const result = streamText({
    model: aiModel(c, kind),
    prompt: PROMPT,
    tools: aiTools(c),
    maxRetries: 0,
    onError: ({ error }) => errors.push(String(error?.message ?? error)),
  });
  const parts = [];
  for await (const part of result.fullStream) parts.push(part.type);
  if (errors.length) throw new Error(errors.join("; "));
  const calls = (await result.toolCalls).map((call) => ({
    name: call.toolName,
    arguments: JSON.stringify(call.input),
  }));
  return {
    text: await result.text,
    reasoning: (await result.reasoningText) ?? "",
    calls,
    finish: await result.finishReason,
  };
}

const CLIENTS = {
  "node-chat-create": nodeChatCreate,
  "node-chat-helper": nodeChatHelper,
  "node-chat-runtools": nodeChatRunTools,
  "node-responses-create": nodeResponsesCreate,
  "node-responses-helper": nodeResponsesHelper,
  "ai-chat": (c) => aiSdk(c, "chat"),
  "ai-responses": (c) => aiSdk(c, "responses"),
  "node-chat-json": nodeChatJson,
  "node-responses-json": nodeResponsesJson,
  "ai-chat-json": (c) => aiSdkJson(c, "chat"),
  "ai-responses-json": (c) => aiSdkJson(c, "responses"),
};

let input = "";
for await (const piece of process.stdin) input += piece;
for (const c of JSON.parse(input)) {
  let line;
  try {
    line = { id: c.id, client: c.client, ok: true, ...(await CLIENTS[c.client](c)) };
  } catch (error) {
    line = { id: c.id, ok: false, error: String(error?.stack ?? error) };
  }
  console.log(JSON.stringify(line));
}
