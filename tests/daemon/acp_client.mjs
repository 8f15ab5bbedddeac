// An editor's side of ACP, with the npm SDK's client connection (@agentclientprotocol/sdk).
//
// Run as `node acp_client.mjs` with a JSON scenario on stdin:
//   {"command": [...weald acp...], "cwd": "/project", "env": {...},
//    "prompts": ["...", ...], "answers": ["allow", "deny", ...]}
// It spawns the agent, initializes, opens a session, sends each prompt in
// turn (answering permission requests from `answers`), and prints one JSON
// object: the initialize result, the session id, each prompt's result, the
// updates and the permission requests it received.
import { spawn } from "node:child_process";
import { Readable, Writable } from "node:stream";
import * as acp from "@agentclientprotocol/sdk";

const chunks = [];
for await (const chunk of process.stdin) chunks.push(chunk);
const scenario = JSON.parse(Buffer.concat(chunks).toString("utf8"));

const child = spawn(scenario.command[0], scenario.command.slice(1), {
  cwd: scenario.cwd,
  env: scenario.env,
  stdio: ["pipe", "pipe", "inherit"],
});
const stream = acp.ndJsonStream(Writable.toWeb(child.stdin), Readable.toWeb(child.stdout));
const updates = [];
const permissions = [];
const answers = [...scenario.answers];

const app = acp
  .client()
  .onNotification("session/update", ({ params }) => {
    updates.push(params.update);
  })
  .onRequest("session/request_permission", ({ params }) => {
    permissions.push(params);
    return { outcome: { outcome: "selected", optionId: answers.shift() } };
  });

const connection = app.connect(stream);
const agent = connection.agent;
const init = await agent.request("initialize", {
  protocolVersion: acp.PROTOCOL_VERSION,
  clientCapabilities: { fs: { readTextFile: false, writeTextFile: false }, terminal: false },
  clientInfo: { name: "weald-test-editor", version: "1.0.0" },
});
const session = await agent.request("session/new", { cwd: scenario.cwd, mcpServers: [] });
const results = [];
for (const text of scenario.prompts) {
  results.push(
    await agent.request("session/prompt", { sessionId: session.sessionId, prompt: [{ type: "text", text }] }),
  );
}
process.stdout.write(JSON.stringify({ init, sessionId: session.sessionId, results, updates, permissions }) + "\n");
connection.close();
child.stdin.end();
const code = await new Promise((resolve) => child.on("exit", (status) => resolve(status)));
process.exit(code === 0 ? 0 : 3);
