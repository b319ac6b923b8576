// Small, pure formatting helpers shared by every screen.
import type { CommandError } from "./bindings";

const pad = (n: number, width = 2) => String(n).padStart(width, "0");

/** Local wall-clock time, `HH:MM:SS`. */
export function formatTime(ms: number): string {
  const d = new Date(ms);
  return `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
}

/** Local date, `YYYY-MM-DD`. */
export function formatDate(ms: number): string {
  const d = new Date(ms);
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())}`;
}

/** Local date and time, `YYYY-MM-DD HH:MM:SS`. */
export function formatDateTime(ms: number): string {
  return `${formatDate(ms)} ${formatTime(ms)}`;
}

/** Time only when `ms` is today, otherwise date and time. */
export function formatWhen(ms: number, now: number = Date.now()): string {
  return formatDate(ms) === formatDate(now) ? formatTime(ms) : formatDateTime(ms);
}

/** A duration in the two largest units: `12s`, `3m 12s`, `2h 05m`, `4d 3h`. */
export function formatDuration(ms: number): string {
  const total = Math.max(0, Math.floor(ms / 1000));
  const days = Math.floor(total / 86400);
  const hours = Math.floor((total % 86400) / 3600);
  const minutes = Math.floor((total % 3600) / 60);
  const seconds = total % 60;
  if (days > 0) return `${days}d ${hours}h`;
  if (hours > 0) return `${hours}h ${pad(minutes)}m`;
  if (minutes > 0) return `${minutes}m ${pad(seconds)}s`;
  return `${seconds}s`;
}

/** `3m 12s ago`, or `just now` under two seconds. */
export function formatAgo(ms: number, now: number = Date.now()): string {
  const delta = now - ms;
  if (delta < 2000) return "just now";
  return `${formatDuration(delta)} ago`;
}

/** The first `length` characters of a hash or fingerprint (no ellipsis). */
export function shortHash(hash: string, length = 12): string {
  return hash.slice(0, length);
}

/** `512 bytes`, `1.5 KiB`, `3.2 MiB`. */
export function formatBytes(n: number): string {
  if (n < 1024) return `${n} ${n === 1 ? "byte" : "bytes"}`;
  if (n < 1024 * 1024) return `${(n / 1024).toFixed(1)} KiB`;
  return `${(n / (1024 * 1024)).toFixed(1)} MiB`;
}

/** Server time of a query: `850 µs`, `1.2 ms`, `1.35 s`. */
export function formatMicros(us: number): string {
  if (us < 1000) return `${Math.round(us)} µs`;
  if (us < 1_000_000) return `${(us / 1000).toFixed(1)} ms`;
  return `${(us / 1_000_000).toFixed(2)} s`;
}

/** Thousands separators without depending on the locale: `1 234 567`. */
export function formatCount(n: number): string {
  return String(n).replace(/\B(?=(\d{3})+(?!\d))/g, "\u2009");
}

/** A `datetime-local` input value to unix ms; empty or invalid gives `null`. */
export function localInputToMs(value: string): number | null {
  if (!value) return null;
  const ms = new Date(value).getTime();
  return Number.isFinite(ms) ? ms : null;
}

/** Enum-ish identifiers for display: `remote_execution` → `remote execution`. */
export function humanize(value: string): string {
  return value.replace(/_/g, " ");
}

/** What a rejected command tells the person: the message and the field it is about. */
export function describeError(error: unknown): { message: string; field: string | null } {
  if (error && typeof error === "object" && "message" in error) {
    const e = error as Partial<CommandError>;
    return { message: String(e.message), field: typeof e.field === "string" ? e.field : null };
  }
  if (typeof error === "string" && error) return { message: error, field: null };
  return { message: "Something went wrong talking to the broker.", field: null };
}

export function errorMessage(error: unknown): string {
  return describeError(error).message;
}
