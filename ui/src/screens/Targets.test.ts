import { render, screen, within } from "@testing-library/svelte";
import userEvent from "@testing-library/user-event";
import { describe, expect, test } from "vitest";
import type { TargetCard } from "../lib/bindings";
import { NEW_TARGET_TEMPLATE, parseTargetName } from "../lib/targets";
import { mockBackend, settle } from "../test/backend";
import Targets from "./Targets.svelte";

const ORDERS: TargetCard = {
  name: "orders-api",
  channel: "http",
  location: "https://api.example.com/",
  credential: "orders-token",
  approval: "per_call",
  require_confined: false,
  version: "9f8e7d6c5b4a39281706f5e4d3c2b1a0",
  toml: '[[http]]\nname = "orders-api"\nbase_url = "https://api.example.com/"\n',
};

describe("Targets", () => {
  test("lists the config path and each target", async () => {
    mockBackend({ list_targets: { config_path: "/home/ada/.config/postern/postern.toml", targets: [ORDERS] } });
    render(Targets);
    await settle();
    expect(screen.getByTestId("config-path").textContent).toBe("/home/ada/.config/postern/postern.toml");
    const target = screen.getByTestId("target");
    expect(target.dataset.name).toBe("orders-api");
    expect(target.textContent).toContain("HTTP");
    expect(target.textContent).toContain("https://api.example.com/");
    expect(target.textContent).toContain("orders-token");
    expect(target.textContent).toContain("per call");
    expect(target.textContent).toContain("9f8e7d6c5b4a");
    expect(target.textContent).not.toContain(ORDERS.version);
  });

  test("a target that takes only confined agents says so", async () => {
    mockBackend({
      list_targets: { config_path: "/c.toml", targets: [ORDERS, { ...ORDERS, name: "prod", require_confined: true }] },
    });
    render(Targets);
    await settle();
    const [orders, prod] = screen.getAllByTestId("target");
    expect(within(orders).queryByTestId("target-confined")).toBeNull();
    expect(within(prod).getByTestId("target-confined").textContent).toBe("confined agents only");
  });

  test("Edit prefills the TOML and Save sends it under the target's name", async () => {
    const backend = mockBackend({
      list_targets: { config_path: "/c.toml", targets: [ORDERS] },
      update_target: { ...ORDERS, version: "0011223344556677889900" },
    });
    render(Targets);
    await settle();
    await userEvent.click(within(screen.getByTestId("target")).getByTestId("edit-target"));
    const editor = screen.getByTestId("target-toml") as HTMLTextAreaElement;
    expect(editor.value).toBe(ORDERS.toml);
    await userEvent.type(editor, 'methods = [["GET"]\n');
    await userEvent.click(screen.getByTestId("save-target"));
    await settle();
    expect(backend.callsTo("update_target")).toEqual([
      { cmd: "update_target", args: { edit: { name: "orders-api", toml: ORDERS.toml + 'methods = ["GET"]\n' } } },
    ]);
    expect(screen.getByTestId("target-saved").textContent).toBe("Saved: new version 001122334455");
  });

  test("a rejected save shows the message", async () => {
    mockBackend({
      list_targets: { config_path: "/c.toml", targets: [ORDERS] },
      update_target: () => {
        throw { code: "INVALID_TARGET", message: "line 3: unknown field `methodz`", field: "toml" };
      },
    });
    render(Targets);
    await settle();
    await userEvent.click(screen.getByTestId("edit-target"));
    await userEvent.click(screen.getByTestId("save-target"));
    await settle();
    expect(screen.getByTestId("target-error").textContent).toContain("line 3: unknown field `methodz`");
    expect(screen.getByTestId("target-error").textContent).toContain("The config file is unchanged.");
  });

  test("Add target starts from the template and saves under the name in the text", async () => {
    const backend = mockBackend({
      list_targets: { config_path: "/c.toml", targets: [] },
      update_target: { ...ORDERS, name: "new-target" },
    });
    render(Targets);
    await settle();
    await userEvent.click(screen.getByTestId("add-target"));
    expect((screen.getByTestId("target-toml") as HTMLTextAreaElement).value).toBe(NEW_TARGET_TEMPLATE);
    await userEvent.click(screen.getByTestId("save-target"));
    await settle();
    expect(backend.callsTo("update_target")[0].args).toEqual({ edit: { name: "new-target", toml: NEW_TARGET_TEMPLATE } });
  });

  test("parseTargetName reads the name line", () => {
    expect(parseTargetName('[[ssh]]\n  name = "db1"\nhost = "x"')).toBe("db1");
    expect(parseTargetName("[[http]]\nbase_url = 'x'")).toBeNull();
  });
});
