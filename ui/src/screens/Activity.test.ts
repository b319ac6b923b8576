import { fireEvent, render, screen, waitFor } from "@testing-library/svelte";
import userEvent from "@testing-library/user-event";
import { describe, expect, test } from "vitest";
import type { ActivityFilter, ActivityPage } from "../lib/bindings";
import { emitEvent, mockBackend, settle } from "../test/backend";
import { detail, page, row } from "../test/fixtures";
import Activity from "./Activity.svelte";

const EMPTY_FILTER: ActivityFilter = {
  session: null,
  target: null,
  phase: null,
  outcome: null,
  code: null,
  since_ms: null,
  until_ms: null,
  text: null,
};

/** A journal of `total` rows (seq total..1), paged by `before_seq` like the backend. */
function journal(total: number) {
  return (args: Record<string, unknown>): ActivityPage => {
    const before = (args.beforeSeq as number | null) ?? total + 1;
    const limit = args.limit as number;
    const from = before - 1;
    const count = Math.max(0, Math.min(limit, from));
    const last = from - count + 1;
    return page(from, count, last > 1 ? last : null);
  };
}

function scrollTo(top: number) {
  const viewport = screen.getByTestId("activity-viewport");
  viewport.scrollTop = top;
  return fireEvent.scroll(viewport);
}

describe("Activity", () => {
  test("the first page asks for the newest rows: beforeSeq null, limit 100", async () => {
    const backend = mockBackend({ query_activity: journal(250) });
    render(Activity);
    await settle();
    expect(backend.callsTo("query_activity")[0].args).toEqual({ filter: EMPTY_FILTER, beforeSeq: null, limit: 100 });
    const rows = screen.getAllByTestId("activity-row");
    expect(rows[0].dataset.invocation).toBe("inv-250");
    expect(rows[0].textContent).toContain("orders-api");
    expect(rows[0].textContent).toContain("GET https://api.example.com/orders/250");
    expect(screen.getByTestId("took").textContent).toBe("first page in 1.2 ms");
  });

  test("scrolling near the end fetches the next page with next_before_seq, and stops at the last page", async () => {
    const backend = mockBackend({ query_activity: journal(250) });
    render(Activity);
    await settle();
    expect(backend.callsTo("query_activity")).toHaveLength(1);

    await scrollTo(100 * 34 - 600);
    await settle();
    let queries = backend.callsTo("query_activity");
    expect(queries).toHaveLength(2);
    expect(queries[1].args).toMatchObject({ beforeSeq: 151, limit: 100 });

    await scrollTo(200 * 34 - 600);
    await settle();
    queries = backend.callsTo("query_activity");
    expect(queries).toHaveLength(3);
    expect(queries[2].args).toMatchObject({ beforeSeq: 51 });

    // The third page was the last (next_before_seq null): no more queries however far we scroll.
    await scrollTo(250 * 34);
    await settle();
    expect(backend.callsTo("query_activity")).toHaveLength(3);
    expect(screen.getByTestId("activity-viewport").textContent).toContain("End of journal.");
  });

  test("Load more fetches the next page", async () => {
    const backend = mockBackend({ query_activity: journal(1000) });
    render(Activity);
    await settle();
    await userEvent.click(screen.getByTestId("load-more"));
    await settle();
    expect(backend.callsTo("query_activity")[1].args).toMatchObject({ beforeSeq: 901 });
  });

  test("changing the outcome filter starts again from the first page", async () => {
    const backend = mockBackend({ query_activity: journal(1000) });
    render(Activity);
    await settle();
    await scrollTo(100 * 34 - 600);
    await settle();
    expect(backend.callsTo("query_activity")).toHaveLength(2);

    await userEvent.selectOptions(screen.getByTestId("filter-outcome"), "unknown");
    await settle();
    const last = backend.callsTo("query_activity").at(-1)!;
    expect(last.args).toEqual({ filter: { ...EMPTY_FILTER, outcome: "unknown" }, beforeSeq: null, limit: 100 });
  });

  test("phase and code filters are sent as values", async () => {
    const backend = mockBackend({ query_activity: journal(10) });
    render(Activity);
    await settle();
    await userEvent.selectOptions(screen.getByTestId("filter-phase"), "remote_execution");
    await userEvent.selectOptions(screen.getByTestId("filter-code"), "REMOTE_OUTCOME_UNKNOWN");
    await settle();
    expect(backend.callsTo("query_activity").at(-1)!.args.filter).toEqual({
      ...EMPTY_FILTER,
      phase: "remote_execution",
      code: "REMOTE_OUTCOME_UNKNOWN",
    });
  });

  test("text search is debounced into one query", async () => {
    const backend = mockBackend({ query_activity: journal(10) });
    render(Activity);
    await settle();
    await userEvent.type(screen.getByTestId("filter-text"), "orders");
    await waitFor(() => expect(backend.callsTo("query_activity").at(-1)!.args.filter).toMatchObject({ text: "orders" }));
    expect(backend.callsTo("query_activity")).toHaveLength(2);
  });

  test("only a window of 10,000 loaded rows is in the DOM", async () => {
    const rows = Array.from({ length: 10_000 }, (_, i) => row(10_000 - i));
    mockBackend({ query_activity: { rows, next_before_seq: null, took_us: 900 } });
    render(Activity);
    await settle();
    const rendered = screen.getAllByTestId("activity-row");
    expect(rendered.length).toBeGreaterThan(10);
    expect(rendered.length).toBeLessThan(60);
    expect(screen.getByTestId("took").textContent).toBe("first page in 900 µs");

    await scrollTo(5000 * 34);
    await settle();
    const indexes = screen.getAllByTestId("activity-row").map((r) => Number(r.dataset.index));
    expect(indexes).toContain(5000);
    expect(indexes.length).toBeLessThan(60);
    expect(Math.min(...indexes)).toBeGreaterThan(4900);
  });

  test("clicking a row opens the record in a side panel", async () => {
    const backend = mockBackend({ query_activity: journal(5), invocation_detail: detail("inv-4") });
    render(Activity);
    await settle();
    await userEvent.click(screen.getAllByTestId("activity-row")[1]);
    await settle();
    expect(backend.callsTo("invocation_detail")[0].args).toEqual({ invocationId: "inv-4" });
    const panel = screen.getByTestId("activity-detail");
    expect(panel.textContent).toContain("What the record proves");
    expect(panel.textContent).toContain("The request was sent to api.example.com.");
    expect(panel.textContent).toContain("That the remote applied it.");
    expect(screen.getByTestId("envelope").textContent).toBe(
      JSON.stringify({ status: "failed", error: { code: "REMOTE_OUTCOME_UNKNOWN" } }, null, 2),
    );
  });

  test("the panel shows a batch's members, a job and the invocations linked to it", async () => {
    mockBackend({
      query_activity: journal(5),
      invocation_detail: detail("inv-4", {
        members: [
          { id: "a", outcome: "committed", status: "201", settled_by: "remote_response" },
          { id: "b", outcome: "unknown", status: null, settled_by: null },
        ],
        job: {
          submission: "inv-1",
          job_id: "job-7",
          status_resource: "https://api.example.com/jobs/7",
          pollable: false,
          state: "pending",
          polls: 1,
          last_poll: null,
        },
        related: [
          { invocation_id: "inv-1", relation: "job", role: "parent" },
          { invocation_id: "inv-9", relation: "reconcile_query", role: "child" },
        ],
      }),
    });
    render(Activity);
    await settle();
    await userEvent.click(screen.getAllByTestId("activity-row")[1]);
    await settle();
    const members = screen.getByTestId("members");
    expect(members.querySelectorAll("tbody tr")).toHaveLength(2);
    expect(members.textContent).toContain("201");
    expect(members.textContent).toContain("remote response");
    expect(members.textContent).toContain("not yet");
    const job = screen.getByTestId("job");
    expect(job.textContent).toContain("job-7");
    expect(job.textContent).toContain("pending");
    expect(job.textContent).toContain("after 1 read of");
    expect(job.textContent).toContain("outside this target");
    const related = screen.getByTestId("related");
    expect(related.textContent).toContain("Started for inv-1");
    expect(related.textContent).toContain("Started inv-9");
    expect(related.textContent).toContain("reconcile query");
  });

  test("Enter on a focused row opens it; arrows move between rows", async () => {
    const backend = mockBackend({ query_activity: journal(5), invocation_detail: detail("inv-4") });
    render(Activity);
    await settle();
    const first = screen.getAllByTestId("activity-row")[0];
    first.focus();
    await userEvent.keyboard("{ArrowDown}");
    await settle();
    expect((document.activeElement as HTMLElement).dataset.invocation).toBe("inv-4");
    await userEvent.keyboard("{Enter}");
    await settle();
    expect(backend.callsTo("invocation_detail")[0].args).toEqual({ invocationId: "inv-4" });
  });

  test("unknown outcomes are marked", async () => {
    mockBackend({
      query_activity: { rows: [row(2, { outcome: "unknown", code: "REMOTE_OUTCOME_UNKNOWN" }), row(1)], next_before_seq: null, took_us: 5 },
    });
    render(Activity);
    await settle();
    const [unknown, committed] = screen.getAllByTestId("activity-row");
    expect(unknown.classList.contains("unknown")).toBe(true);
    expect(unknown.querySelector('[data-testid="chip-outcome"]')!.classList.contains("unknown")).toBe(true);
    expect(committed.classList.contains("unknown")).toBe(false);
  });

  test("export reports the file and row count", async () => {
    const backend = mockBackend({
      query_activity: journal(3),
      export_activity: { path: "/home/ada/postern-activity.csv", rows: 3 },
    });
    render(Activity);
    await settle();
    await userEvent.click(screen.getByTestId("export-csv"));
    await settle();
    expect(backend.callsTo("export_activity")[0].args).toEqual({ filter: EMPTY_FILTER, format: "csv" });
    expect(screen.getByTestId("export-result").textContent).toBe("Exported 3 rows to /home/ada/postern-activity.csv");
  });

  test("empty journal and no matches have their own messages", async () => {
    mockBackend({ query_activity: { rows: [], next_before_seq: null, took_us: 5 } });
    render(Activity);
    await settle();
    expect(screen.getByTestId("empty-state").textContent).toContain("The journal has no invocations yet.");
    await userEvent.selectOptions(screen.getByTestId("filter-outcome"), "rejected");
    await settle();
    expect(screen.getByTestId("empty-state").textContent).toContain("No invocations match these filters.");
  });

  test("journalChanged refreshes the first page only at the top", async () => {
    let total = 300;
    const backend = mockBackend({ query_activity: (args: Record<string, unknown>) => journal(total)(args) });
    render(Activity);
    await settle();
    total = 301;
    await emitEvent("journal-changed", { last_seq: 301 });
    await waitFor(() => expect(screen.getAllByTestId("activity-row")[0].dataset.invocation).toBe("inv-301"));
    const count = backend.callsTo("query_activity").length;

    await scrollTo(20 * 34);
    await settle();
    total = 302;
    await emitEvent("journal-changed", { last_seq: 302 });
    await new Promise((r) => setTimeout(r, 1100));
    await settle();
    expect(backend.callsTo("query_activity")).toHaveLength(count);
    expect(screen.getByText("New activity · show")).toBeTruthy();
  });

  test("a failed first page offers Retry", async () => {
    let fail = true;
    mockBackend({
      query_activity: (args: Record<string, unknown>) => {
        if (fail) throw { code: "JOURNAL_UNREADABLE", message: "The journal could not be read: locked", field: null };
        return journal(3)(args);
      },
    });
    render(Activity);
    await settle();
    expect(screen.getByTestId("load-error").textContent).toContain("The journal could not be read: locked");
    fail = false;
    await userEvent.click(screen.getByTestId("retry"));
    await settle();
    expect(screen.getAllByTestId("activity-row")).toHaveLength(3);
  });
});
