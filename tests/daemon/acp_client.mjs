// An editor's side of ACP, with the npm SDK's client connection (@agentclientprotocol/sdk).
//
// Run as `node acp_client.mjs` with a JSON scenario on stdin:
//   {"command": [...weald acp...], "cwd": "/project", "env": {...},
//    "prompts": ["...", ...], "answers": ["allow", "deny", ...],
//    "buffers": {"/project/app.py": "unsaved text", ...}}   (optional)
// It spawns the agent, initializes, opens a session, sends each prompt in
// turn (answering permission requests from `answers`), and prints one JSON
// object: the initialize result, the session id, each prompt's result, the
// updates and the permission requests it received.
//
// With `buffers`, it is an editor that offers its files and terminals, as Zed
// does: fs/read_text_file answers from the buffers (the unsaved text) before
// the disk, fs/write_text_file changes a buffer only, and terminal/* run real
// processes. It then also prints the buffers at the end and the fs/terminal
// requests it served.
import { spawn } from "node:child_process";
import { readFile } from "node:fs/promises";
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

const editing = scenario.buffers !== undefined;
const buffers = { ...(scenario.buffers ?? {}) };
const served = [];
const terminals = new Map();

let app = acp
  .client()
  .onNotification("session/update", ({ params }) => {
    updates.push(params.update);
  })
  .onRequest("session/request_permission", ({ params }) => {
    permissions.push(params);
    return { outcome: { outcome: "selected", optionId: answers.shift() } };
  });
if (editing) {
  app = app
    .onRequest("fs/read_text_file", async ({ params }) => {
      served.push(["fs/read_text_file", params.path]);
      if (params.path in buffers) return { content: buffers[params.path] };
      try {
        return { content: await readFile(params.path, "utf8") };
      } catch {
        throw new acp.RequestError(-32002, `no such file: ${params.path}`);
      }
    })
    .onRequest("fs/write_text_file", ({ params }) => {
      served.push(["fs/write_text_file", params.path]);
      buffers[params.path] = params.content;
      return {};
    })
    .onRequest("terminal/create", ({ params }) => {
      served.push(["terminal/create", params.command]);
      const child = spawn(params.command, params.args ?? [], {
        cwd: params.cwd,
        env: { ...process.env, EDITOR_ONLY_TOKEN: "editor-secret-value" },
        stdio: ["ignore", "pipe", "pipe"],
      });
      const terminal = { output: "", status: null };
      terminal.exited = new Promise((resolve) =>
        child.on("close", (code, signal) => {
          terminal.status = { exitCode: code, signal };
          resolve(terminal.status);
        }),
      );
      child.stdout.on("data", (chunk) => (terminal.output += chunk));
      child.stderr.on("data", (chunk) => (terminal.output += chunk));
      terminal.child = child;
      const terminalId = `node-term-${terminals.size + 1}`;
      terminals.set(terminalId, terminal);
      return { terminalId };
    })
    .onRequest("terminal/output", ({ params }) => {
      served.push(["terminal/output", params.terminalId]);
      const terminal = terminals.get(params.terminalId);
      return { output: terminal.output, truncated: false, exitStatus: terminal.status };
    })
    .onRequest("terminal/wait_for_exit", async ({ params }) => {
      served.push(["terminal/wait_for_exit", params.terminalId]);
      return await terminals.get(params.terminalId).exited;
    })
    .onRequest("terminal/kill", ({ params }) => {
      served.push(["terminal/kill", params.terminalId]);
      terminals.get(params.terminalId).child.kill();
      return {};
    })
    .onRequest("terminal/release", ({ params }) => {
      served.push(["terminal/release", params.terminalId]);
      const terminal = terminals.get(params.terminalId);
      if (terminal.status === null) terminal.child.kill();
      terminals.delete(params.terminalId);
      return {};
    });
}

const connection = app.connect(stream);
const agent = connection.agent;
const init = await agent.request("initialize", {
  protocolVersion: acp.PROTOCOL_VERSION,
  clientCapabilities: { fs: { readTextFile: editing, writeTextFile: editing }, terminal: editing },
  clientInfo: { name: "weald-test-editor", version: "1.0.0" },
});
const session = await agent.request("session/new", { cwd: scenario.cwd, mcpServers: [] });
const results = [];
for (const text of scenario.prompts) {
  results.push(
    await agent.request("session/prompt", { sessionId: session.sessionId, prompt: [{ type: "text", text }] }),
  );
}
const out = { init, sessionId: session.sessionId, results, updates, permissions };
if (editing) Object.assign(out, { buffers, served, openTerminals: terminals.size });
process.stdout.write(JSON.stringify(out) + "\n");
connection.close();
child.stdin.end();
const code = await new Promise((resolve) => child.on("exit", (status) => resolve(status)));
process.exit(code === 0 ? 0 : 3);
