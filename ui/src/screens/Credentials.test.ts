import { render, screen, within } from "@testing-library/svelte";
import userEvent from "@testing-library/user-event";
import { describe, expect, test } from "vitest";
import { mockBackend, settle } from "../test/backend";
import { credential } from "../test/fixtures";
import Credentials from "./Credentials.svelte";

const SECRET = "ghp_SuperSecretValue_1234567890";

describe("Credentials", () => {
  test("lists credentials with kind, version and usage", async () => {
    mockBackend({
      list_credentials: [credential("orders-token"), credential("db-key", { kind: "ssh_key", used_by: [], last_used_ms: Date.now() - 60_000 })],
    });
    render(Credentials);
    await settle();
    const rows = screen.getAllByTestId("credential");
    expect(rows.map((r) => r.dataset.id)).toEqual(["orders-token", "db-key"]);
    expect(rows[0].textContent).toContain("never");
    expect(rows[0].textContent).toContain("orders-api");
    expect(rows[0].textContent).toContain("v-0123456789");
    expect(rows[1].textContent).toContain("ssh key");
    expect(rows[1].textContent).toContain("1m 00s ago");
  });

  test("storing sends the secret once, then clears it and never shows it", async () => {
    const backend = mockBackend({ list_credentials: [], set_credential: credential("orders-token") });
    render(Credentials);
    await settle();
    await userEvent.type(screen.getByTestId("cred-id"), "orders-token");
    await userEvent.type(screen.getByTestId("cred-secret"), SECRET);
    await userEvent.click(screen.getByTestId("cred-submit"));
    await settle();
    expect(backend.callsTo("set_credential")).toEqual([
      { cmd: "set_credential", args: { credential: { id: "orders-token", kind: "token", secret: SECRET, passphrase: null } } },
    ]);
    const input = screen.getByTestId("cred-secret") as HTMLInputElement;
    expect(input.type).toBe("password");
    expect(input.value).toBe("");
    expect(document.body.innerHTML).not.toContain(SECRET);
    expect(screen.getByTestId("cred-message").textContent).toContain("Stored orders-token in the keychain");
  });

  test("a failed store also clears the secret and highlights the field", async () => {
    mockBackend({
      list_credentials: [],
      set_credential: () => {
        throw { code: "INVALID_REQUEST", message: "That is not a valid id.", field: "id" };
      },
    });
    render(Credentials);
    await settle();
    await userEvent.type(screen.getByTestId("cred-id"), "bad id");
    await userEvent.type(screen.getByTestId("cred-secret"), SECRET);
    await userEvent.click(screen.getByTestId("cred-submit"));
    await settle();
    expect((screen.getByTestId("cred-secret") as HTMLInputElement).value).toBe("");
    expect(screen.getByTestId("cred-error").textContent).toBe("That is not a valid id.");
    expect(screen.getByTestId("cred-id").getAttribute("aria-invalid")).toBe("true");
    expect(document.body.innerHTML).not.toContain(SECRET);
  });

  test("an SSH key is pasted in a textarea, with an optional passphrase", async () => {
    const backend = mockBackend({ list_credentials: [], set_credential: credential("db-key", { kind: "ssh_key" }) });
    render(Credentials);
    await settle();
    await userEvent.type(screen.getByTestId("cred-id"), "db-key");
    await userEvent.selectOptions(screen.getByTestId("cred-kind"), "ssh_key");
    const secret = screen.getByTestId("cred-secret");
    expect(secret.tagName).toBe("TEXTAREA");
    await userEvent.type(secret, "-----BEGIN KEY-----");
    await userEvent.type(screen.getByTestId("cred-passphrase"), "hunter2");
    await userEvent.click(screen.getByTestId("cred-submit"));
    await settle();
    expect(backend.callsTo("set_credential")[0].args).toEqual({
      credential: { id: "db-key", kind: "ssh_key", secret: "-----BEGIN KEY-----", passphrase: "hunter2" },
    });
    expect((screen.getByTestId("cred-passphrase") as HTMLInputElement).value).toBe("");
    expect(document.body.innerHTML).not.toContain("hunter2");
  });

  test("Rotate opens the form on the same id and kind", async () => {
    const backend = mockBackend({
      list_credentials: [credential("orders-token", { kind: "basic" })],
      set_credential: credential("orders-token", { kind: "basic" }),
    });
    render(Credentials);
    await settle();
    await userEvent.click(screen.getByTestId("rotate"));
    await settle();
    expect((screen.getByTestId("cred-id") as HTMLInputElement).value).toBe("orders-token");
    expect((screen.getByTestId("cred-kind") as HTMLSelectElement).value).toBe("basic");
    await userEvent.type(screen.getByTestId("cred-secret"), "ada:new-password");
    await userEvent.click(screen.getByTestId("cred-submit"));
    await settle();
    expect(backend.callsTo("set_credential")[0].args).toEqual({
      credential: { id: "orders-token", kind: "basic", secret: "ada:new-password", passphrase: null },
    });
    expect(screen.getByTestId("cred-message").textContent).toContain("Rotated orders-token");
  });

  test("Remove needs a confirmation", async () => {
    const backend = mockBackend({ list_credentials: [credential("orders-token")], remove_credential: null });
    render(Credentials);
    await settle();
    const row = screen.getByTestId("credential");
    const remove = within(row).getByTestId("remove");
    expect(remove.textContent?.trim()).toBe("Remove");
    await userEvent.click(remove);
    expect(backend.callsTo("remove_credential")).toEqual([]);
    expect(within(row).getByTestId("remove").textContent?.trim()).toBe("Confirm remove");
    await userEvent.click(within(row).getByTestId("remove"));
    await settle();
    expect(backend.callsTo("remove_credential")).toEqual([{ cmd: "remove_credential", args: { id: "orders-token" } }]);
  });

  test("the confirmation can be cancelled", async () => {
    const backend = mockBackend({ list_credentials: [credential("orders-token")], remove_credential: null });
    render(Credentials);
    await settle();
    await userEvent.click(screen.getByTestId("remove"));
    await userEvent.click(screen.getByRole("button", { name: "Cancel" }));
    expect(screen.getByTestId("remove").textContent?.trim()).toBe("Remove");
    await userEvent.click(screen.getByTestId("remove"));
    expect(backend.callsTo("remove_credential")).toEqual([]);
  });

  test("empty and error states", async () => {
    let fail = true;
    mockBackend({
      list_credentials: () => {
        if (fail) throw { code: "VAULT_LOCKED", message: "The keychain is locked.", field: null };
        return [];
      },
    });
    render(Credentials);
    await settle();
    expect(screen.getByTestId("load-error").textContent).toContain("The keychain is locked.");
    fail = false;
    await userEvent.click(screen.getByTestId("retry"));
    await settle();
    expect(screen.getByTestId("empty-state").textContent).toContain("No credentials yet.");
  });
});
