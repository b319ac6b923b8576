import { fireEvent, render, screen } from "@testing-library/svelte";
import userEvent from "@testing-library/user-event";
import { describe, expect, test } from "vitest";
import App from "./App.svelte";
import { emitEvent, mockBackend, settle } from "./test/backend";
import { approvalCard, integrity, overview } from "./test/fixtures";

function backendWith(overviewData = overview()) {
  return mockBackend({
    overview: overviewData,
    integrity: integrity(),
    list_approvals: [],
    list_sessions: [],
    list_credentials: [],
    list_targets: { config_path: "/etc/postern.toml", targets: [] },
    needs_reconciliation: [],
    peer_incidents: [],
    query_activity: { rows: [], next_before_seq: null, took_us: 10 },
  });
}

describe("App", () => {
  test("an empty vault opens onboarding with the three steps", async () => {
    backendWith(overview({ vault_empty: true }));
    render(App);
    await settle();
    const onboarding = screen.getByTestId("onboarding");
    expect(onboarding.textContent).toContain("Add a credential");
    expect(screen.getByTestId("onboarding-config-path").textContent).toBe("/home/ada/.config/postern/postern.toml");
    expect(JSON.parse(screen.getByTestId("mcp-snippet").textContent!)).toEqual({
      mcpServers: { postern: { command: "/opt/postern/bin/postern", args: ["mcp", "--socket", "/run/user/1000/postern.sock"] } },
    });
    // The banner is there too.
    expect(screen.getByTestId("integrity-banner").dataset.state).toBe("verified");
  });

  test("Skip to console leaves onboarding for the approvals screen", async () => {
    backendWith(overview({ vault_empty: true }));
    render(App);
    await settle();
    await userEvent.click(screen.getByTestId("onboarding-skip"));
    await settle();
    expect(screen.queryByTestId("onboarding")).toBeNull();
    expect(screen.getByTestId("screen-approvals")).toBeTruthy();
  });

  test("onboarding step buttons go to Credentials and Targets", async () => {
    backendWith(overview({ vault_empty: true }));
    render(App);
    await settle();
    await userEvent.click(screen.getByTestId("onboarding-credentials"));
    await settle();
    expect(screen.getByTestId("screen-credentials")).toBeTruthy();
  });

  test("a vault with credentials opens the console directly, with badges", async () => {
    backendWith(overview({ pending_approvals: 2, needs_reconciliation: 5 }));
    render(App);
    await settle();
    expect(screen.queryByTestId("onboarding")).toBeNull();
    expect(screen.getByTestId("screen-approvals")).toBeTruthy();
    expect(screen.getByTestId("badge-approvals").textContent).toBe("2");
    expect(screen.getByTestId("badge-reconcile").textContent).toBe("5");
  });

  test("sidebar buttons switch screens", async () => {
    backendWith();
    render(App);
    await settle();
    const pairs: [string, string][] = [
      ["nav-sessions", "screen-sessions"],
      ["nav-activity", "screen-activity"],
      ["nav-reconcile", "screen-reconcile"],
      ["nav-credentials", "screen-credentials"],
      ["nav-targets", "screen-targets"],
      ["nav-incidents", "screen-incidents"],
      ["nav-approvals", "screen-approvals"],
    ];
    for (const [nav, screenId] of pairs) {
      await userEvent.click(screen.getByTestId(nav));
      await settle();
      expect(screen.getByTestId(screenId)).toBeTruthy();
      expect(screen.getByTestId(nav).getAttribute("aria-current")).toBe("page");
    }
  });

  test("Alt+1..Alt+7 switch screens", async () => {
    backendWith();
    render(App);
    await settle();
    await fireEvent.keyDown(window, { key: "3", code: "Digit3", altKey: true });
    await settle();
    expect(screen.getByTestId("screen-activity")).toBeTruthy();
    await fireEvent.keyDown(window, { key: "™", code: "Digit6", altKey: true });
    await settle();
    expect(screen.getByTestId("screen-targets")).toBeTruthy();
    await fireEvent.keyDown(window, { key: "7", code: "Digit7", altKey: true });
    await settle();
    expect(screen.getByTestId("screen-incidents")).toBeTruthy();
    await fireEvent.keyDown(window, { key: "1", code: "Digit1", altKey: true });
    await settle();
    expect(screen.getByTestId("screen-approvals")).toBeTruthy();
  });

  test("badges follow approvalsChanged and the re-fetched overview", async () => {
    let pending = 0;
    const backend = mockBackend({
      overview: () => overview({ pending_approvals: pending }),
      integrity: integrity(),
      list_approvals: [],
    });
    render(App);
    await settle();
    expect(screen.getByTestId("badge-approvals").textContent).toBe("0");
    pending = 1;
    await emitEvent("approvals-changed", { pending: [approvalCard()] });
    expect(screen.getByTestId("badge-approvals").textContent).toBe("1");
    expect(backend.callsTo("overview").length).toBeGreaterThan(1);
  });

  test("Pause agents pauses through the backend, shows the banner, and Resume lifts it", async () => {
    const backend = mockBackend({
      overview: overview(),
      integrity: integrity(),
      list_approvals: [],
      pause_agents: { paused: true },
      resume_agents: { paused: false },
    });
    render(App);
    await settle();
    expect(screen.queryByTestId("pause-banner")).toBeNull();
    expect(screen.getByTestId("toggle-pause").textContent).toBe("Pause agents");
    await userEvent.click(screen.getByTestId("toggle-pause"));
    await settle();
    expect(backend.callsTo("pause_agents").length).toBe(1);
    expect(screen.getByTestId("pause-banner").textContent).toContain("AGENTS_PAUSED");
    expect(screen.getByTestId("toggle-pause").getAttribute("aria-pressed")).toBe("true");
    await userEvent.click(screen.getByTestId("resume-agents"));
    await settle();
    expect(backend.callsTo("resume_agents").length).toBe(1);
    expect(screen.queryByTestId("pause-banner")).toBeNull();
    expect(screen.getByTestId("toggle-pause").textContent).toBe("Pause agents");
  });

  test("a pause from the tray (or another operator) reaches the window", async () => {
    mockBackend({ overview: overview({ agents_paused: true }), integrity: integrity(), list_approvals: [] });
    render(App);
    await settle();
    expect(screen.getByTestId("pause-banner")).toBeTruthy();
    await emitEvent("pause-changed", { paused: false });
    expect(screen.queryByTestId("pause-banner")).toBeNull();
    await emitEvent("pause-changed", { paused: true });
    expect(screen.getByTestId("pause-banner")).toBeTruthy();
  });

  test("a refused pause says why and changes nothing", async () => {
    mockBackend({
      overview: overview(),
      integrity: integrity(),
      list_approvals: [],
      pause_agents: () => {
        throw { code: "OPERATOR_UNREACHABLE", message: "The broker's operator socket did not answer.", field: null };
      },
    });
    render(App);
    await settle();
    await userEvent.click(screen.getByTestId("toggle-pause"));
    await settle();
    expect(screen.getByTestId("pause-error").textContent).toContain("did not answer");
    expect(screen.queryByTestId("pause-banner")).toBeNull();
  });

  test("an unreachable broker shows the error with Retry", async () => {
    let fail = true;
    mockBackend({
      overview: () => {
        if (fail) throw { code: "BROKER_UNAVAILABLE", message: "The broker did not start.", field: null };
        return overview();
      },
      integrity: integrity(),
      list_approvals: [],
    });
    render(App);
    await settle();
    expect(screen.getByTestId("load-error").textContent).toContain("The broker did not start.");
    fail = false;
    await userEvent.click(screen.getByTestId("retry"));
    await settle();
    expect(screen.getByTestId("screen-approvals")).toBeTruthy();
  });
});
