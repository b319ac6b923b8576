/** The table an "Add target" editor starts from. */
export const NEW_TARGET_TEMPLATE = `[[http]]
name = "new-target"
base_url = "https://api.example.com/"
methods = ["GET"]
credential = "my-token"
inject = { header = "Authorization", format = "Bearer {secret}" }
approval = "per_call"
idempotent_methods = ["GET"]
`;

/** The `name = "..."` of a target table, or `null`. */
export function parseTargetName(toml: string): string | null {
  const match = /^\s*name\s*=\s*"([^"]*)"/m.exec(toml);
  return match ? match[1] : null;
}
