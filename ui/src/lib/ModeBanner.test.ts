import { render, screen } from "@testing-library/svelte";
import { describe, expect, test } from "vitest";
import { overview } from "../test/fixtures";
import ModeBanner from "./ModeBanner.svelte";

describe("Mode banner", () => {
  test("single-user mode says what it does not protect against", () => {
    render(ModeBanner, { overview: overview({ mode: "single_user" }) });
    const banner = screen.getByTestId("mode-banner");
    expect(banner.dataset.mode).toBe("single_user");
    expect(banner.textContent).toContain("an agent running as you can read the journal");
    expect(banner.textContent).toContain("keychain");
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
