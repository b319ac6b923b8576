// A mocked Tauri backend for component tests: records every operator command with its
// arguments. The app's one Tauri command, `operator`, carries `{ request: { command, args } }`;
// each call is recorded under the operator command it carries.
import { emit } from "@tauri-apps/api/event";
import { mockIPC } from "@tauri-apps/api/mocks";
import { tick } from "svelte";

export type Call = { cmd: string; args: Record<string, unknown> };
export type Handler = (args: Record<string, unknown>) => unknown;

export function mockBackend(handlers: Record<string, Handler | unknown>) {
  const calls: Call[] = [];
  mockIPC(
    async (tauriCmd, tauriArgs) => {
      let cmd = tauriCmd;
      let a = (tauriArgs ?? {}) as Record<string, unknown>;
      if (cmd === "operator") {
        const request = a.request as { command: string; args?: Record<string, unknown> };
        cmd = request.command;
        a = request.args ?? {};
      }
      calls.push({ cmd, args: a });
      if (!(cmd in handlers)) throw { code: "UNMOCKED", message: `no mock for ${cmd}`, field: null };
      const handler = handlers[cmd];
      return typeof handler === "function" ? await (handler as Handler)(a) : handler;
    },
    { shouldMockEvents: true },
  );
  return {
    calls,
    callsTo: (cmd: string) => calls.filter((c) => c.cmd === cmd),
  };
}

/** Lets pending promises, listener registration and Svelte updates settle. */
export async function settle(rounds = 5) {
  for (let i = 0; i < rounds; i++) {
    await new Promise((resolve) => setTimeout(resolve, 0));
    await tick();
  }
}

/** Emits a backend event (after letting listeners register). */
export async function emitEvent(event: string, payload: unknown) {
  await settle();
  await emit(event, payload);
  await settle();
}
