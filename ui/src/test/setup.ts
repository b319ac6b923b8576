import { cleanup } from "@testing-library/svelte";
import { clearMocks } from "@tauri-apps/api/mocks";
import { afterEach } from "vitest";

afterEach(() => {
  // Unmount first (components unlisten through the mocked IPC), then drop the mocks.
  cleanup();
  clearMocks();
});
