/// <reference types="vitest/config" />
import { defineConfig } from "vite";
import { svelte } from "@sveltejs/vite-plugin-svelte";

export default defineConfig(({ mode }) => ({
  base: "./",
  plugins: [svelte()],
  // Tauri loads the dev server from `devUrl` in tauri.conf.json.
  server: { port: 5173, strictPort: true },
  clearScreen: false,
  build: {
    outDir: "dist",
    emptyOutDir: true,
    target: "es2021",
    // Never inline assets as data: URLs; everything is served from 'self'.
    assetsInlineLimit: 0,
  },
  // Vitest runs with mode "test": resolve Svelte's browser build for jsdom.
  resolve: mode === "test" ? { conditions: ["browser"] } : undefined,
  test: {
    environment: "jsdom",
    include: ["src/**/*.test.ts"],
    setupFiles: ["src/test/setup.ts"],
  },
}));
