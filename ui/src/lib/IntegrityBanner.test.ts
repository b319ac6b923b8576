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
    expect(screen.getByTestId("integrity-assurance").textContent).toContain("could read and re-sign with");
  });

  test("a witnessed journal says how many witnesses hold it", async () => {
    mockBackend({
      integrity: integrity({
        witnesses: 2,
        assurance:
          "signed with a key in the user's keychain, which any process of that user could read and re-sign with; cosigned by 2 witnesses: a rewrite behind what they hold fails even with the signing key",
      }),
    });
    render(IntegrityBanner);
    await settle();
    expect(screen.getByTestId("integrity-assurance").textContent).toContain("cosigned by 2 witnesses");
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

  test("unsigned events are counted and never shown as verified", async () => {
    const failure = "audit chain broken at sequence 41: Unsigned: 9 events after sequence 40 are not signed";
    mockBackend({
      integrity: integrity({ state: "unsigned", unsigned_events: 9, through_seq: 40, first_bad_seq: 41, failure }),
    });
    render(IntegrityBanner);
    await settle();
    const banner = screen.getByTestId("integrity-banner");
    expect(banner.dataset.state).toBe("unsigned");
    expect(banner.getAttribute("role")).toBe("alert");
    expect(screen.getByTestId("integrity-unsigned").textContent).toMatch(/9 events not yet signed/);
    expect(banner.textContent).not.toMatch(/verified/i);
    expect(screen.getByTestId("integrity-failure").textContent).toBe(failure);
  });

  test("an empty journal is not called verified", async () => {
    mockBackend({ integrity: integrity({ state: "empty", events: 0, checkpoints: 0, through_seq: 0 }) });
    render(IntegrityBanner);
    await settle();
    const banner = screen.getByTestId("integrity-banner");
    expect(banner.dataset.state).toBe("empty");
    expect(banner.textContent).not.toMatch(/verified/i);
  });

  test("ranges signed late are shown beside a verified chain", async () => {
    const note = "events 33..=40 were signed only when the broker next started (sequence 41)";
    mockBackend({ integrity: integrity({ notes: [note] }) });
    render(IntegrityBanner);
    await settle();
    expect(screen.getByTestId("integrity-note").textContent).toBe(note);
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
