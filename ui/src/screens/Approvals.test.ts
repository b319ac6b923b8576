import { cleanup, fireEvent, render, screen, within } from "@testing-library/svelte";
import userEvent from "@testing-library/user-event";
import { describe, expect, test } from "vitest";
import { emitEvent, mockBackend, settle } from "../test/backend";
import { CARD_DIGEST, EXE_BLAKE3, FINGERPRINT, agent, approvalCard } from "../test/fixtures";
import Approvals from "./Approvals.svelte";

async function renderWith(cards = [approvalCard()], answer: unknown = null) {
  const backend = mockBackend({ list_approvals: cards, answer_approval: answer });
  render(Approvals);
  await settle();
  return backend;
}

/** Renders the screen with both of its loads (at mount, once listening) held: answer
 * each with the returned functions, in any order. */
async function renderWithHeldLoads() {
  const answers: ((cards: unknown[]) => void)[] = [];
  mockBackend({ list_approvals: () => new Promise((resolve) => answers.push(resolve)) });
  render(Approvals);
  await settle();
  expect(answers).toHaveLength(2);
  return answers;
}

describe("Approvals", () => {
  test("a card shows everything the decision is about", async () => {
    await renderWith();
    const card = screen.getByTestId("approval-card");
    expect(card.dataset.invocation).toBe("inv-1");
    expect(card.dataset.mode).toBe("per_call");
    const text = card.textContent ?? "";
    expect(text).toContain("Approve this request?");
    expect(text).toContain("/usr/bin/claude");
    expect(text).toContain("4242");
    expect(text).toContain("/home/ada/project");
    expect(text).toMatch(/zsh.*4100/);
    expect(text).toMatch(/session running for 3m 1\ds/);
    expect(within(card).getByTestId("card-target").textContent).toBe("orders-api");
    expect(within(card).getByTestId("card-method").textContent).toBe("POST");
    expect(within(card).getByTestId("card-url").textContent).toBe("https://api.example.com/orders?limit=5");
    expect(text).toContain("orders-token");
    expect(within(card).getByTestId("card-credential").textContent).toMatch(/orders-token\s+version cv-77aa88bb99cc/);
    expect(text).toContain("bearer header");
    expect(text).toContain("idem-123");
    expect(text).toContain("(truncated)");
    expect(text).toContain("blake3 0123456789abcdef…");
    expect(text).toContain("size 2.0 KiB");
    expect(within(card).getByTestId("card-fingerprint").textContent).toBe(FINGERPRINT.slice(0, 16));
    expect(text).toMatch(/expires in 1m 5\ds|expires in 2m 00s/);
    // The agent is the recorded one, with the digest of its binary, and the card names
    // its own digest.
    expect(within(card).getByTestId("card-agent-digest").textContent).toContain(EXE_BLAKE3.slice(0, 16));
    expect(text).toContain("uid 1000");
    expect(within(card).getByTestId("card-digest").textContent).toBe(CARD_DIGEST.slice(0, 16));
    // What approving covers is said before the buttons (issue 26, item 7).
    expect(within(card).getByTestId("card-covers").textContent).toContain("at most 2 resends");
  });

  // Regression: issue 26 (item 1): the card showed no headers at all.
  test("every header the agent sent is on the card in order, flagged ones first", async () => {
    const digest = "ee".repeat(32);
    await renderWith([
      approvalCard({
        method: "GET",
        body: null,
        cautions: ["header X-HTTP-Method-Override: method override: the server may run another method than the one shown"],
        headers: [
          { name: "X-Pad", value: "A".repeat(256), size: 61440, digest, truncated: true, flag: null },
          { name: "X-Do", value: "wire-transfer", size: 13, digest, truncated: false, flag: null },
          {
            name: "X-HTTP-Method-Override",
            value: "DELETE",
            size: 6,
            digest,
            truncated: false,
            flag: "method override: the server may run another method than the one shown",
          },
        ],
        added: ["host: api.example.com", "authorization: Bearer <credential orders-token>"],
      }),
    ]);
    const card = screen.getByTestId("approval-card");
    const cautions = within(card).getByTestId("card-cautions");
    expect(cautions.textContent).toContain("X-HTTP-Method-Override");
    // The cautions come before the request line, so they are read first.
    expect(cautions.compareDocumentPosition(within(card).getByTestId("card-request")) & Node.DOCUMENT_POSITION_FOLLOWING).toBeTruthy();
    const rows = within(card).getAllByTestId("card-header").map((li) => li.textContent ?? "");
    expect(rows).toHaveLength(3);
    expect(rows[0]).toMatch(/^X-Pad:/);
    expect(rows[0]).toContain("(truncated: 60.0 KiB, blake3 eeeeeeeeeeeeeeee…)");
    expect(rows[1]).toContain("X-Do: wire-transfer");
    expect(rows[2]).toContain("DELETE");
    expect(rows[2]).toContain("method override");
    expect(within(card).getByTestId("card-added").textContent).toContain("<credential orders-token>");
  });

  test("an SSH card shows the command's stdin like a body", async () => {
    await renderWith([
      approvalCard({
        method: null,
        url: null,
        body: null,
        ssh_destination: "deploy@web1:22",
        command: "bash -s",
        stdin: { size: 12, digest: "ab".repeat(32), text: "touch victim", truncated: false },
        cautions: ["stdin is a script: the command starts bash, which runs what it reads from stdin"],
      }),
    ]);
    const card = screen.getByTestId("approval-card");
    expect(within(card).getByTestId("card-stdin").textContent).toContain("touch victim");
    expect(within(card).getByTestId("card-stdin").textContent).toContain("blake3 abababababababab…");
    expect(within(card).getByTestId("card-cautions").textContent).toContain("starts bash");
    expect(within(card).queryByTestId("card-headers")).toBeNull();
  });

  // Regression: issue 26 (item 5): a broker running as another user could not read the
  // agent's executable, and the card showed the argv the agent chose as its name.
  test("an agent the broker could not read is named by uid and pid, and its claims are labelled", async () => {
    await renderWith([
      approvalCard({
        recorded_agent: {
          ...approvalCard().recorded_agent!,
          user_name: "agentuser",
          uid: 1001,
          executable: null,
          executable_blake3: null,
          executable_verified: false,
          executable_unreadable: "Permission denied (os error 13)",
          reported_by_bridge: {
            parent_pid: 4242,
            parent_executable: "/usr/bin/bash",
            parent_executable_blake3: EXE_BLAKE3,
            parent_executable_unreadable: null,
            bridge_executable: "/usr/bin/postern",
          },
        },
        agent: agent({
          agent: { pid: 4242, executable: null, claimed_command: "/usr/local/bin/claude-code --approved-by-security-team", cwd: null },
        }),
      }),
    ]);
    expect(screen.getByTestId("card-agent-known").textContent).toMatch(/uid 1001 \(agentuser\)\s+pid 4242/);
    expect(screen.getByTestId("card-agent-unverified").textContent).toContain("executable not verified");
    expect(screen.getByTestId("card-agent-unverified").textContent).toContain("Permission denied");
    expect(screen.queryByTestId("card-agent-digest")).toBeNull();
    const claim = screen.getByTestId("card-agent-bridge-claim").textContent ?? "";
    expect(claim).toContain("claimed by the bridge, not verified");
    expect(claim).toContain("/usr/bin/bash");
    const argv = screen.getByTestId("card-agent-argv").textContent ?? "";
    expect(argv).toContain("as the process claims it");
    expect(argv).toContain("--approved-by-security-team");
    // The forged name appears only under the claim.
    const known = screen.getByTestId("card-agent-known").textContent ?? "";
    expect(known).not.toContain("claude-code");
  });

  test("the card says whether the asking agent is confined", async () => {
    await renderWith([approvalCard()]);
    expect(screen.getByTestId("card-agent-confinement").textContent).toContain("not confined");
    cleanup();
    const shield = "shield shd_0123456789abcdef (network broker_only, profile blake3:00112233445)";
    await renderWith([
      approvalCard({ recorded_agent: { ...approvalCard().recorded_agent!, confinement: shield } }),
    ]);
    expect(screen.getByTestId("card-agent-confinement").textContent).toContain(shield);
  });

  test("the body preview is shown as text, never as markup", async () => {
    await renderWith();
    const pre = screen.getByTestId("card-body").querySelector("pre")!;
    expect(pre.textContent).toBe('{"item":"<script>alert(1)</script>"}');
    expect(document.querySelector("script")).toBeNull();
    expect(pre.innerHTML).toContain("&lt;script&gt;");
  });

  test("no body, no idempotency key and no agent are said plainly", async () => {
    await renderWith([approvalCard({ body: null, idempotency_key: null, agent: null, recorded_agent: null })]);
    expect(screen.getByTestId("card-body").textContent).toContain("no body");
    expect(screen.getByTestId("card-idempotency").textContent).toContain("none");
    expect(screen.getByTestId("card-agent").textContent).toContain("agent process unknown");
  });

  test("Approve sends back the full fingerprint the card showed", async () => {
    const backend = await renderWith();
    await userEvent.click(screen.getByTestId("approve"));
    await settle();
    expect(backend.callsTo("answer_approval")).toEqual([
      { cmd: "answer_approval", args: { invocationId: "inv-1", fingerprint: FINGERPRINT, cardDigest: CARD_DIGEST, decision: "approve" } },
    ]);
    // Removed optimistically.
    expect(screen.queryByTestId("approval-card")).toBeNull();
  });

  test("Deny sends decision deny", async () => {
    const backend = await renderWith();
    await userEvent.click(screen.getByTestId("deny"));
    await settle();
    expect(backend.callsTo("answer_approval")[0].args).toEqual({
      invocationId: "inv-1",
      fingerprint: FINGERPRINT,
      cardDigest: CARD_DIGEST,
      decision: "deny",
    });
  });

  test("Escape denies the focused card", async () => {
    const backend = await renderWith([approvalCard(), approvalCard({ invocation_id: "inv-2", fingerprint: "ab".repeat(32) })]);
    const second = screen.getAllByTestId("approval-card")[1];
    second.focus();
    await fireEvent.keyDown(second, { key: "Escape" });
    await settle();
    expect(backend.callsTo("answer_approval").map((c) => c.args)).toEqual([
      { invocationId: "inv-2", fingerprint: "ab".repeat(32), cardDigest: CARD_DIGEST, decision: "deny" },
    ]);
  });

  test("Escape with focus elsewhere denies the first card", async () => {
    const backend = await renderWith();
    await userEvent.keyboard("{Escape}");
    await settle();
    expect(backend.callsTo("answer_approval").map((c) => c.args)).toEqual([
      { invocationId: "inv-1", fingerprint: FINGERPRINT, cardDigest: CARD_DIGEST, decision: "deny" },
    ]);
  });

  test("Enter never approves: not on the card, not anywhere", async () => {
    const backend = await renderWith();
    const card = screen.getByTestId("approval-card");
    card.focus();
    await fireEvent.keyDown(card, { key: "Enter" });
    await userEvent.keyboard("{Enter}");
    await settle();
    expect(document.activeElement).not.toBe(screen.getByTestId("approve"));
    expect(backend.callsTo("answer_approval")).toEqual([]);
  });

  test("no button is autofocused", async () => {
    await renderWith();
    expect(document.activeElement).toBe(document.body);
  });

  test("host_key mode asks about the key and shows it", async () => {
    await renderWith([
      approvalCard({
        mode: "host_key",
        method: null,
        url: null,
        body: null,
        ssh_destination: "deploy@db1.internal:22",
        command: "systemctl restart app",
        host_key: "ssh-ed25519 SHA256:abcDEF123+/xyz",
      }),
    ]);
    const card = screen.getByTestId("approval-card");
    expect(card.dataset.mode).toBe("host_key");
    expect(card.textContent).toContain("First connection to deploy@db1.internal:22: trust this host key?");
    expect(screen.getByTestId("host-key").textContent).toContain("ssh-ed25519 SHA256:abcDEF123+/xyz");
    expect(screen.getByTestId("card-command").textContent).toBe("systemctl restart app");
  });

  test("session mode names the target in the header", async () => {
    await renderWith([approvalCard({ mode: "session" })]);
    expect(screen.getByRole("heading", { level: 2 }).textContent).toContain("Approve this agent session for orders-api?");
  });

  test("an error stays inside the card and the buttons come back", async () => {
    mockBackend({
      list_approvals: [approvalCard()],
      answer_approval: () => {
        throw { code: "FINGERPRINT_MISMATCH", message: "The request changed since this card was shown.", field: null };
      },
    });
    render(Approvals);
    await settle();
    await userEvent.click(screen.getByTestId("approve"));
    await settle();
    const card = screen.getByTestId("approval-card");
    expect(within(card).getByTestId("card-error").textContent).toBe("The request changed since this card was shown.");
    expect((screen.getByTestId("approve") as HTMLButtonElement).disabled).toBe(false);
  });

  test("both buttons are disabled while the answer is in flight", async () => {
    let release!: () => void;
    mockBackend({
      list_approvals: [approvalCard()],
      answer_approval: () => new Promise<null>((resolve) => (release = () => resolve(null))),
    });
    render(Approvals);
    await settle();
    await userEvent.click(screen.getByTestId("deny"));
    expect((screen.getByTestId("approve") as HTMLButtonElement).disabled).toBe(true);
    expect((screen.getByTestId("deny") as HTMLButtonElement).disabled).toBe(true);
    release();
    await settle();
  });

  test("approvalsChanged replaces the list", async () => {
    await renderWith();
    expect(screen.getAllByTestId("approval-card")).toHaveLength(1);
    await emitEvent("approvals-changed", {
      pending: [approvalCard({ invocation_id: "inv-9" }), approvalCard({ invocation_id: "inv-10" })],
    });
    expect(screen.getAllByTestId("approval-card").map((c) => c.dataset.invocation)).toEqual(["inv-9", "inv-10"]);
    await emitEvent("approvals-changed", { pending: [] });
    expect(screen.queryByTestId("approval-card")).toBeNull();
    expect(screen.getByTestId("empty-state").textContent).toContain("No requests are waiting.");
  });

  test("a card that arrives while the screen starts listening is shown", async () => {
    // The first load is answered before the card exists; its approvals-changed was
    // emitted before the screen listened. The load after listening finds it.
    let loads = 0;
    mockBackend({ list_approvals: () => (loads++ === 0 ? [] : [approvalCard()]) });
    render(Approvals);
    await settle();
    expect(loads).toBe(2);
    expect(screen.getAllByTestId("approval-card")).toHaveLength(1);
  });

  test("a load answered after a newer approvals-changed does not hide its card", async () => {
    // Both loads (at mount, and once listening) are computed before the card exists, and
    // their answers arrive after the event that carries it: the event is newer and wins.
    const answers = await renderWithHeldLoads();
    await emitEvent("approvals-changed", { pending: [approvalCard()] });
    expect(screen.getAllByTestId("approval-card")).toHaveLength(1);
    for (const answer of answers) answer([]);
    await settle();
    expect(screen.getAllByTestId("approval-card")).toHaveLength(1);
  });

  test("of two loads, the later one's answer stands even when it arrives first", async () => {
    const answers = await renderWithHeldLoads();
    answers[1]([approvalCard()]);
    await settle();
    answers[0]([]);
    await settle();
    expect(screen.getAllByTestId("approval-card")).toHaveLength(1);
  });

  test("an expired request says so and cannot be approved", async () => {
    await renderWith([approvalCard({ expires_at_ms: Date.now() - 1000 })]);
    expect(screen.getByTestId("countdown").textContent?.trim()).toBe("expired");
    expect((screen.getByTestId("approve") as HTMLButtonElement).disabled).toBe(true);
    expect((screen.getByTestId("deny") as HTMLButtonElement).disabled).toBe(false);
  });

  test("the empty state explains what will appear", async () => {
    await renderWith([]);
    expect(screen.getByTestId("empty-state").textContent).toContain(
      "No requests are waiting. Agents' requests that need your approval appear here, with a desktop notification.",
    );
  });

  test("a load failure shows the message and Retry", async () => {
    let fail = true;
    mockBackend({
      list_approvals: () => {
        if (fail) throw { code: "BROKER_UNAVAILABLE", message: "The broker is not running.", field: null };
        return [approvalCard()];
      },
    });
    render(Approvals);
    await settle();
    expect(screen.getByTestId("load-error").textContent).toContain("The broker is not running.");
    fail = false;
    await userEvent.click(screen.getByTestId("retry"));
    await settle();
    expect(screen.getAllByTestId("approval-card")).toHaveLength(1);
  });
});
