import { render, screen, within } from "@testing-library/svelte";
import userEvent from "@testing-library/user-event";
import { describe, expect, test } from "vitest";
import type { SessionSummary } from "../lib/bindings";
import { mockBackend, settle } from "../test/backend";
import { CARD_DIGEST, EXE_BLAKE3, agent, approvalProof, detail, recordedAgent } from "../test/fixtures";
import Sessions from "./Sessions.svelte";

const SESSIONS: SessionSummary[] = [
  { session: "sess-1", invocations: 3, first_at_ms: Date.now() - 60_000, last_at_ms: Date.now() - 5_000, agent: agent(), recorded: recordedAgent() },
  { session: "sess-0", invocations: 1, first_at_ms: Date.now() - 600_000, last_at_ms: Date.now() - 500_000, agent: null, recorded: null },
];

describe("Sessions", () => {
  test("lists sessions with agent, count and liveness", async () => {
    mockBackend({ list_sessions: SESSIONS });
    render(Sessions);
    await settle();
    const [live, ended] = screen.getAllByTestId("session-item");
    expect(live.dataset.session).toBe("sess-1");
    expect(live.textContent).toContain("/usr/bin/claude");
    expect(live.textContent).toContain("pid 4242");
    expect(live.textContent).toContain("3 invocations");
    expect(live.textContent).toContain("live");
    expect(ended.textContent).toContain("ended");
  });

  test("each session says whether its agent is confined, and how", async () => {
    const shield = "shield shd_0123456789abcdef (network full, profile blake3:00112233445)";
    const confined: SessionSummary = {
      session: "sess-2",
      invocations: 1,
      first_at_ms: Date.now() - 30_000,
      last_at_ms: Date.now() - 1_000,
      agent: agent({ session: "sess-2", confinement: shield }),
      recorded: recordedAgent({ session: "sess-2", confinement: shield }),
    };
    mockBackend({ list_sessions: [confined, ...SESSIONS], session_timeline: [] });
    render(Sessions);
    await settle();
    const [shielded, unconfined] = screen.getAllByTestId("session-confinement");
    expect(shielded.textContent).toBe("shielded");
    expect(shielded.title).toBe(shield);
    expect(unconfined.textContent).toBe("unconfined");
    await userEvent.click(screen.getAllByTestId("session-item")[0]);
    await settle();
    expect(screen.getByTestId("session-confinement-detail").textContent).toContain(shield);
  });

  test("selecting a session draws each invocation's lifecycle", async () => {
    const backend = mockBackend({ list_sessions: SESSIONS, session_timeline: [detail("inv-7")] });
    render(Sessions);
    await settle();
    await userEvent.click(screen.getAllByTestId("session-item")[0]);
    await settle();
    expect(backend.callsTo("session_timeline")[0].args).toEqual({ session: "sess-1" });
    const invocation = screen.getByTestId("timeline-invocation");
    expect(invocation.dataset.invocation).toBe("inv-7");
    const reached = [...invocation.querySelectorAll<HTMLElement>("[data-reached]")]
      .filter((s) => s.dataset.reached === "true")
      .map((s) => s.dataset.step);
    expect(reached).toEqual(["accepted", "validated", "dispatched"]);
    expect(invocation.querySelector('[data-step="failed"]')).toBeTruthy();
    expect(within(invocation).getByTestId("chip-outcome").classList.contains("unknown")).toBe(true);
    expect(within(invocation).getByTestId("evidence").tagName).toBe("DETAILS");
    expect(within(invocation).getByTestId("envelope").textContent).toContain('"status": "failed"');
  });

  test("arrow keys move through the list", async () => {
    const backend = mockBackend({ list_sessions: SESSIONS, session_timeline: [] });
    render(Sessions);
    await settle();
    await userEvent.click(screen.getAllByTestId("session-item")[0]);
    await userEvent.keyboard("{ArrowDown}");
    await settle();
    expect(backend.callsTo("session_timeline").map((c) => c.args.session)).toEqual(["sess-1", "sess-0"]);
    expect((document.activeElement as HTMLElement).dataset.session).toBe("sess-0");
  });

  test("a session from an earlier run shows its agent as the journal recorded it", async () => {
    // After a restart nothing is live: the identity comes from SESSION_OPENED.
    const past: SessionSummary = {
      session: "sess_9_77",
      invocations: 1,
      first_at_ms: Date.now() - 900_000,
      last_at_ms: Date.now() - 800_000,
      agent: null,
      recorded: recordedAgent({ session: "sess_9_77", pid: 9, executable: "/opt/agent/bin/agent" }),
    };
    const backend = mockBackend({
      list_sessions: [past],
      session_timeline: [detail("inv-8", { agent: past.recorded, approval: approvalProof() })],
    });
    render(Sessions);
    await settle();
    const item = screen.getByTestId("session-item");
    expect(item.textContent).toContain("/opt/agent/bin/agent");
    expect(item.textContent).toContain("pid 9");
    expect(item.textContent).toContain("ended");
    await userEvent.click(item);
    await settle();
    expect(backend.callsTo("session_timeline")[0].args).toEqual({ session: "sess_9_77" });
    const identity = screen.getByTestId("session-identity").textContent ?? "";
    expect(identity).toContain("uid 1000");
    expect(identity).toContain(EXE_BLAKE3.slice(0, 16));
    const invocation = screen.getByTestId("timeline-invocation");
    expect(within(invocation).getByTestId("invocation-agent").textContent).toContain("/opt/agent/bin/agent");
    const approval = within(invocation).getByTestId("invocation-approval");
    expect(approval.dataset.matched).toBe("true");
    expect(approval.textContent).toContain("granted by console:ada");
    expect(approval.textContent).toContain(CARD_DIGEST.slice(0, 12));
    expect(approval.textContent).toContain("the answer names the card that was shown");
  });

  test("an answer naming another card than the recorded one is flagged", async () => {
    mockBackend({
      list_sessions: SESSIONS,
      session_timeline: [detail("inv-9", { approval: approvalProof({ answered_card_digest: "ab".repeat(32), matched: false }) })],
    });
    render(Sessions);
    await settle();
    await userEvent.click(screen.getAllByTestId("session-item")[0]);
    await settle();
    const approval = screen.getByTestId("invocation-approval");
    expect(approval.dataset.matched).toBe("false");
    expect(approval.textContent).toContain("a different card");
  });

  test("empty state", async () => {
    mockBackend({ list_sessions: [] });
    render(Sessions);
    await settle();
    expect(screen.getByTestId("empty-state").textContent).toContain("No agent sessions yet.");
  });
});
