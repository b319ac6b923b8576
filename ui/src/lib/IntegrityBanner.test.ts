import { render, screen } from "@testing-library/svelte";
import userEvent from "@testing-library/user-event";
import { describe, expect, test } from "vitest";
import { emitEvent, mockBackend, settle } from "../test/backend";
import { integrity } from "../test/fixtures";
import IntegrityBanner from "./IntegrityBanner.svelte";

describe("Integrity banner", () => {
  test("starts from integrity(false) and says how far the chain is verified", async () => {
    const backend = mockBackend({ integrity: integrity() });
    render(IntegrityBanner);
    await settle();
    expect(backend.callsTo("integrity")[0].args).toEqual({ recheck: false });
    const banner = screen.getByTestId("integrity-banner");
    expect(banner.dataset.state).toBe("verified");
    expect(banner.textContent).toMatch(/Audit chain verified through sequence\s+1234\s+at \d{4}-\d\d-\d\d \d\d:\d\d:\d\d/);
    expect(banner.textContent).toContain("12 checkpoints");
  });

  test("a failed chain is an alarm with the exact failure and first bad sequence", async () => {
    const failure = "event 57: prev_hash does not match the hash of event 56";
    mockBackend({ integrity: integrity({ state: "failed", failure, first_bad_seq: 57, through_seq: 56 }) });
    render(IntegrityBanner);
    await settle();
    const banner = screen.getByTestId("integrity-banner");
    expect(banner.dataset.state).toBe("failed");
    expect(banner.getAttribute("role")).toBe("alert");
    expect(banner.textContent).toContain("Audit chain verification FAILED");
    expect(screen.getByTestId("integrity-failure").textContent).toBe(failure);
    expect(banner.textContent).toContain("First bad sequence: 57");
  });

  test("checking while the first answer is pending", async () => {
    mockBackend({ integrity: () => new Promise(() => {}) });
    render(IntegrityBanner);
    await settle();
    expect(screen.getByTestId("integrity-banner").dataset.state).toBe("checking");
  });

  test("Verify now asks for a recheck", async () => {
    const backend = mockBackend({
      integrity: (args: Record<string, unknown>) => integrity({ through_seq: args.recheck ? 2000 : 1234 }),
    });
    render(IntegrityBanner);
    await settle();
    await userEvent.click(screen.getByTestId("verify-now"));
    await settle();
    expect(backend.callsTo("integrity").map((c) => c.args)).toEqual([{ recheck: false }, { recheck: true }]);
    expect(screen.getByTestId("integrity-banner").textContent).toContain("through sequence 2000");
  });

  test("integrityChanged updates the banner", async () => {
    mockBackend({ integrity: integrity() });
    render(IntegrityBanner);
    await settle();
    await emitEvent("integrity-changed", integrity({ state: "failed", failure: "checkpoint 3 signature invalid", first_bad_seq: 300 }));
    expect(screen.getByTestId("integrity-banner").dataset.state).toBe("failed");
    expect(screen.getByTestId("integrity-failure").textContent).toBe("checkpoint 3 signature invalid");
  });
});
