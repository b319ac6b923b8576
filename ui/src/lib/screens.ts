// The console's screens, in sidebar order (Alt+1 … Alt+7).
export type Screen = "approvals" | "sessions" | "activity" | "reconcile" | "credentials" | "targets" | "incidents";

export const SCREENS: { id: Screen; label: string; testid: string }[] = [
  { id: "approvals", label: "Approvals", testid: "nav-approvals" },
  { id: "sessions", label: "Sessions", testid: "nav-sessions" },
  { id: "activity", label: "Activity", testid: "nav-activity" },
  { id: "reconcile", label: "Needs reconciliation", testid: "nav-reconcile" },
  { id: "credentials", label: "Credentials", testid: "nav-credentials" },
  { id: "targets", label: "Targets", testid: "nav-targets" },
  { id: "incidents", label: "Peer incidents", testid: "nav-incidents" },
];

/** The screen an Alt+digit shortcut selects, if any. */
export function screenForShortcut(event: KeyboardEvent): Screen | null {
  if (!event.altKey || event.ctrlKey || event.metaKey || event.shiftKey) return null;
  // `code` survives keyboard layouts where Alt+digit types another character.
  const match = /^(?:Digit|Numpad)([1-7])$/.exec(event.code) ?? /^([1-7])$/.exec(event.key);
  return match ? SCREENS[Number(match[1]) - 1].id : null;
}
