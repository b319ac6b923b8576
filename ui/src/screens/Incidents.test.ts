import { render, screen, within } from "@testing-library/svelte";
import userEvent from "@testing-library/user-event";
import { describe, expect, test } from "vitest";
import type { PeerIncidentRow } from "../lib/bindings";
import { emitEvent, mockBackend, settle } from "../test/backend";
import Incidents from "./Incidents.svelte";

function incident(kind: string, over: Partial<PeerIncidentRow> = {}): PeerIncidentRow {
  const owners: Record<string, string> = {
    policy: "peering_owner",
    contract_violation: "peer_operator",
    transient_exhaustion: "local_operator",
  };
  const codes: Record<string, PeerIncidentRow["code"]> = {
    policy: "PEER_DENIED",
    contract_violation: "PEER_CONTRACT_VIOLATION",
    transient_exhaustion: "PEER_UNAVAILABLE",
  };
  return {
    invocation_id: `inv-${kind}`,
    seq: kind.length,
    at_ms: 1_700_000_000_000,
    kind,
    owner: owners[kind],
    peer: "org-b",
    capability: "payments",
    code: codes[kind],
    signature: kind === "policy" ? "verified" : "failed",
    attestation_digest: "blake3:00112233445566778899aabbccddeeff",
    attestation: { kind: "denial", peer: "postern.local/audit/0102030405060708", signature: "ab" },
    answers: 4,
    transient_used: 0,
    unknown_used: 3,
    envelope: {
      invocation_id: `inv-${kind}`,
      outcome: kind === "policy" ? "not_attempted" : "unknown",
      error: { code: codes[kind], outcome: kind === "policy" ? "not_attempted" : "unknown" },
    },
    ...over,
  };
}

describe("Peer incidents", () => {
  test("each incident shows its kind, owner, peer, capability, time, signature check and envelope", async () => {
    mockBackend({ peer_incidents: [incident("policy"), incident("contract_violation")] });
    render(Incidents);
    await settle();
    const items = screen.getAllByTestId("incident");
    expect(items.map((i) => i.dataset.kind)).toEqual(["policy", "contract_violation"]);

    const policy = items[0];
    expect(within(policy).getByTestId("incident-kind").textContent).toBe("Policy incident");
    expect(within(policy).getByTestId("incident-owner").textContent).toBe("Peering owner");
    expect(within(policy).getByTestId("incident-target").textContent).toBe("peer/org-b/payments");
    expect(within(policy).getByTestId("incident-signature").dataset.value).toBe("verified");
    expect(within(policy).getByTestId("incident-signature").textContent).toContain("verified with the peer's pinned key");
    expect(policy.querySelector("time")?.getAttribute("datetime")).toBe(new Date(1_700_000_000_000).toISOString());
    expect(JSON.parse(within(policy).getByTestId("incident-envelope").textContent!).error.code).toBe("PEER_DENIED");

    const violation = items[1];
    expect(within(violation).getByTestId("incident-owner").textContent).toBe("Operator of the peer broker");
    expect(within(violation).getByTestId("incident-signature").textContent).toContain("did not verify");
    expect(violation.textContent).toContain("This is not a denial");
    expect(within(violation).getByTestId("incident-budget").textContent).toContain("3 unattested retries");
  });

  test("the filter narrows the list to one kind", async () => {
    mockBackend({
      peer_incidents: [incident("policy"), incident("contract_violation"), incident("transient_exhaustion")],
    });
    render(Incidents);
    await settle();
    await userEvent.selectOptions(screen.getByTestId("incident-filter"), "transient_exhaustion");
    const items = screen.getAllByTestId("incident");
    expect(items).toHaveLength(1);
    expect(within(items[0]).getByTestId("incident-owner").textContent).toBe("Local operator");
  });

  test("with no incidents it says so, and a journal change loads them again", async () => {
    let rows: PeerIncidentRow[] = [];
    const backend = mockBackend({ peer_incidents: () => rows });
    render(Incidents);
    await settle();
    expect(screen.getByTestId("empty-state").textContent).toContain("No peer incidents.");
    rows = [incident("policy")];
    await emitEvent("journal-changed", { last_seq: 9 });
    await new Promise((r) => setTimeout(r, 1100));
    await settle();
    expect(backend.callsTo("peer_incidents").length).toBeGreaterThan(1);
    expect(screen.getAllByTestId("incident")).toHaveLength(1);
  });

  test("a failed load offers a retry", async () => {
    let fail = true;
    mockBackend({
      peer_incidents: () => {
        if (fail) throw { code: "JOURNAL_UNREADABLE", message: "The journal could not be read.", field: null };
        return [];
      },
    });
    render(Incidents);
    await settle();
    expect(screen.getByText(/The journal could not be read/)).toBeTruthy();
    fail = false;
    await userEvent.click(screen.getByRole("button", { name: /retry/i }));
    await settle();
    expect(screen.getByTestId("empty-state")).toBeTruthy();
  });
});
