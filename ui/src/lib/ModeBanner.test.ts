import { render, screen } from "@testing-library/svelte";
import { describe, expect, test } from "vitest";
import { overview } from "../test/fixtures";
import ModeBanner from "./ModeBanner.svelte";

describe("Mode banner", () => {
  test("single-user mode says what it does not protect against", () => {
    render(ModeBanner, { overview: overview({ mode: "single_user" }) });
    const banner = screen.getByTestId("mode-banner");
    expect(banner.dataset.mode).toBe("single_user");
    expect(banner.textContent).toMatch(/an agent running as you outside a shield can read the\s+journal/);
    expect(banner.textContent).toContain("keychain");
    expect(banner.textContent).toContain("postern shield -- AGENT");
  });

  test("single-user mode counts the sessions connected now that are not confined", () => {
    const { unmount } = render(ModeBanner, {
      overview: overview({ mode: "single_user", unconfined_sessions: 2, confined_sessions: 1 }),
    });
    expect(screen.getByTestId("unconfined-sessions").textContent).toMatch(
      /2\s+agent sessions connected now are\s+not confined/,
    );
    unmount();
    render(ModeBanner, { overview: overview({ mode: "single_user", unconfined_sessions: 0, confined_sessions: 3 }) });
    expect(screen.getByTestId("unconfined-sessions").textContent).toContain("Every connected agent session is confined");
  });

  test("privilege-separated mode shows the operator socket's refusals", () => {
    render(ModeBanner, { overview: overview({ mode: "privilege_separated", operator_refusals: 3 }) });
    const banner = screen.getByTestId("mode-banner");
    expect(banner.dataset.mode).toBe("privilege_separated");
    expect(banner.textContent).toMatch(/run them as a user\s+outside the operator group/);
    expect(screen.getByTestId("operator-refusals").textContent).toContain("refused 3");
  });

  test("no refusals, no alarm; no overview yet, no banner", () => {
    const { unmount } = render(ModeBanner, { overview: overview({ mode: "privilege_separated" }) });
    expect(screen.queryByTestId("operator-refusals")).toBeNull();
    unmount();
    render(ModeBanner, { overview: null });
    expect(screen.queryByTestId("mode-banner")).toBeNull();
  });
});
