import { describe, expect, test } from "vitest";
import {
  describeError,
  formatBytes,
  formatDuration,
  formatMicros,
  formatTime,
  localInputToMs,
  shortHash,
} from "./format";

describe("format", () => {
  test("durations use the two largest units", () => {
    expect(formatDuration(0)).toBe("0s");
    expect(formatDuration(12_400)).toBe("12s");
    expect(formatDuration(192_000)).toBe("3m 12s");
    expect(formatDuration(2 * 3600_000 + 5 * 60_000)).toBe("2h 05m");
    expect(formatDuration(4 * 86400_000 + 3 * 3600_000)).toBe("4d 3h");
    expect(formatDuration(-5)).toBe("0s");
  });

  test("local time is HH:MM:SS", () => {
    const ms = new Date(2024, 0, 2, 3, 4, 5).getTime();
    expect(formatTime(ms)).toBe("03:04:05");
  });

  test("short hashes, sizes and query times", () => {
    expect(shortHash("0123456789abcdef0123", 16)).toBe("0123456789abcdef");
    expect(formatBytes(1)).toBe("1 byte");
    expect(formatBytes(512)).toBe("512 bytes");
    expect(formatBytes(1536)).toBe("1.5 KiB");
    expect(formatMicros(850)).toBe("850 µs");
    expect(formatMicros(1234)).toBe("1.2 ms");
  });

  test("datetime-local values become unix ms", () => {
    expect(localInputToMs("")).toBeNull();
    expect(localInputToMs("garbage")).toBeNull();
    expect(localInputToMs("2024-01-02T03:04:05")).toBe(new Date(2024, 0, 2, 3, 4, 5).getTime());
  });

  test("command errors give their message and field", () => {
    expect(describeError({ code: "X", message: "Nope", field: "id" })).toEqual({ message: "Nope", field: "id" });
    expect(describeError("plain")).toEqual({ message: "plain", field: null });
    expect(describeError(undefined).message).toMatch(/broker/);
  });
});
