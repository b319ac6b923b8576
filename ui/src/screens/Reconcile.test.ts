import { render, screen, within } from "@testing-library/svelte";
import userEvent from "@testing-library/user-event";
import { describe, expect, test } from "vitest";
import { mockBackend, settle } from "../test/backend";
import type { ConfidenceSource, Settlement } from "../lib/bindings";
import { detail } from "../test/fixtures";
import Reconcile from "./Reconcile.svelte";

const settled = (settlement: Settlement, source: ConfidenceSource = "operator_attested") => ({
  source,
  settlement,
  by: "console:ada",
  note: "checked",
  at_ms: 1_700_000_100_000,
});

describe("Needs reconciliation", () => {
  test("an item shows what the record proves and does not prove", async () => {
    mockBackend({ needs_reconciliation: [detail("inv-7", { manifest_verdict: "retry would duplicate: not idempotent" })] });
    render(Reconcile);
    await settle();
    const item = screen.getByTestId("recon-item");
    expect(item.dataset.invocation).toBe("inv-7");
    expect(within(item).getByTestId("proves").textContent).toContain("The request was sent to api.example.com.");
    expect(within(item).getByTestId("does-not-prove").textContent).toContain("That the remote applied it.");
    expect(within(item).getByTestId("manifest-verdict").textContent).toContain("retry would duplicate: not idempotent");
    expect(item.textContent).toContain("REMOTE_OUTCOME_UNKNOWN");
    expect(screen.getByTestId("screen-reconcile").textContent).toContain("the original attempt is never rewritten");
  });

  test("without a retry manifest it says no retry was planned", async () => {
    mockBackend({ needs_reconciliation: [detail("inv-7")] });
    render(Reconcile);
    await settle();
    expect(screen.getByTestId("manifest-verdict").textContent).toContain("no retry was planned");
  });

  test("the attestation needs both a settlement and a note, then sends them", async () => {
    const backend = mockBackend({
      needs_reconciliation: [detail("inv-7")],
      attest_outcome: detail("inv-7", { unsettled: false, settlement: settled("not_applied") }),
    });
    render(Reconcile);
    await settle();
    const submit = screen.getByTestId("attest-submit") as HTMLButtonElement;
    const select = screen.getByTestId("attest-settlement") as HTMLSelectElement;
    expect(select.value).toBe(""); // no default
    expect(submit.disabled).toBe(true);

    await userEvent.selectOptions(select, "not_applied");
    expect(submit.disabled).toBe(true);
    await userEvent.type(screen.getByTestId("attest-note"), "   ");
    expect(submit.disabled).toBe(true);
    await userEvent.clear(screen.getByTestId("attest-note"));
    await userEvent.type(screen.getByTestId("attest-note"), "No order 1042 in the admin panel");
    expect(submit.disabled).toBe(false);

    await userEvent.click(submit);
    await settle();
    expect(backend.callsTo("attest_outcome")).toEqual([
      {
        cmd: "attest_outcome",
        args: { attestation: { invocation_id: "inv-7", settlement: "not_applied", note: "No order 1042 in the admin panel" } },
      },
    ]);
    expect(screen.getByTestId("attest-result").textContent).toContain("Recorded as operator_attested by console:ada at");
  });

  test("a settled item leaves the list after a moment", async () => {
    mockBackend({
      needs_reconciliation: [detail("inv-7")],
      attest_outcome: detail("inv-7", { unsettled: false, settlement: settled("committed") }),
    });
    render(Reconcile);
    await settle();
    await userEvent.selectOptions(screen.getByTestId("attest-settlement"), "committed");
    await userEvent.type(screen.getByTestId("attest-note"), "Order exists");
    await userEvent.click(screen.getByTestId("attest-submit"));
    await settle();
    expect(screen.getByTestId("recon-item")).toBeTruthy();
    await new Promise((r) => setTimeout(r, 2600));
    await settle();
    expect(screen.queryByTestId("recon-item")).toBeNull();
  });

  test("an attestation error is shown and the form stays", async () => {
    mockBackend({
      needs_reconciliation: [detail("inv-7")],
      attest_outcome: () => {
        throw { code: "INVALID_REQUEST", message: "Say what you checked.", field: "note" };
      },
    });
    render(Reconcile);
    await settle();
    await userEvent.selectOptions(screen.getByTestId("attest-settlement"), "committed");
    await userEvent.type(screen.getByTestId("attest-note"), "x");
    await userEvent.click(screen.getByTestId("attest-submit"));
    await settle();
    expect(screen.getByRole("alert").textContent).toContain("Say what you checked.");
    expect(screen.getByTestId("attest-note").getAttribute("aria-invalid")).toBe("true");
  });

  test("Run reconcile query appears only when the target can be queried", async () => {
    const backend = mockBackend({
      needs_reconciliation: [detail("inv-7"), detail("inv-8", { can_query: true })],
      run_reconcile_query: detail("inv-8", { unsettled: false, settlement: settled("committed", "remote_query") }),
    });
    render(Reconcile);
    await settle();
    const [first, second] = screen.getAllByTestId("recon-item");
    expect(within(first).queryByTestId("run-query")).toBeNull();
    await userEvent.click(within(second).getByTestId("run-query"));
    await settle();
    expect(backend.callsTo("run_reconcile_query")[0].args).toEqual({ invocationId: "inv-8" });
    expect(within(second).getByTestId("query-result").textContent).toContain("The remote says: applied (committed)");
  });

  test("a failing query shows its message", async () => {
    mockBackend({
      needs_reconciliation: [detail("inv-8", { can_query: true })],
      run_reconcile_query: () => {
        throw { code: "CONNECTION_REFUSED", message: "The reconcile endpoint refused the connection.", field: null };
      },
    });
    render(Reconcile);
    await settle();
    await userEvent.click(screen.getByTestId("run-query"));
    await settle();
    expect(screen.getByTestId("query-result").textContent).toBe("The reconcile endpoint refused the connection.");
  });

  test("empty state", async () => {
    mockBackend({ needs_reconciliation: [] });
    render(Reconcile);
    await settle();
    expect(screen.getByTestId("empty-state").textContent).toContain("Nothing needs reconciliation: every outcome is known.");
  });
});
