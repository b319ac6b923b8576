import { render, screen } from "@testing-library/svelte";
import { describe, expect, test } from "vitest";
import { overview } from "../test/fixtures";
import StoreFailureBanner from "./StoreFailureBanner.svelte";

describe("Result store failure banner", () => {
  test("a result that could not be stored raises an alert naming the newest", () => {
    render(StoreFailureBanner, {
      overview: overview({ result_store_failures: 2, result_store_failure_latest: "inv_7" }),
    });
    const banner = screen.getByTestId("store-failure-banner");
    expect(banner.getAttribute("role")).toBe("alert");
    expect(banner.textContent).toContain("2");
    expect(banner.textContent).toContain("RESULT_STORE_FAILED");
    expect(banner.textContent).toContain("inv_7");
  });

  test("no failures, no banner", () => {
    render(StoreFailureBanner, { overview: overview({}) });
    expect(screen.queryByTestId("store-failure-banner")).toBeNull();
  });
});
