import type { UnlistenFn } from "@tauri-apps/api/event";
import { events } from "./bindings";

/**
 * Starts listening to a backend event and returns a synchronous stop function,
 * suitable as an `$effect` / `onMount` cleanup. Stopping before the listener is
 * registered unregisters it as soon as it is.
 *
 * Registration is asynchronous: an event emitted after a screen's first load but
 * before its listener exists is lost. `registered` (the screen's load, say) runs once
 * the listener is in place, so nothing that happened in between is missed.
 */
export function subscribe(listening: Promise<UnlistenFn>, registered?: () => void): () => void {
  let stopped = false;
  let unlisten: UnlistenFn | null = null;
  const stop = (fn: UnlistenFn) => {
    try {
      void Promise.resolve(fn()).catch(() => {});
    } catch {
      // The window is going away; nothing left to unregister.
    }
  };
  listening
    .then((fn) => {
      if (stopped) {
        stop(fn);
      } else {
        unlisten = fn;
        registered?.();
      }
    })
    .catch(() => {
      // No event bridge (e.g. in a plain browser): the screen still works by polling on demand.
    });
  return () => {
    stopped = true;
    if (unlisten) stop(unlisten);
    unlisten = null;
  };
}

/** Runs `fn` at most once per `wait` ms, always including a trailing call. */
export function throttle(fn: () => void, wait: number) {
  let last = 0;
  let timer: ReturnType<typeof setTimeout> | null = null;
  const throttled = () => {
    const now = Date.now();
    const remaining = last + wait - now;
    if (remaining <= 0) {
      last = now;
      fn();
    } else if (!timer) {
      timer = setTimeout(() => {
        timer = null;
        last = Date.now();
        fn();
      }, remaining);
    }
  };
  throttled.cancel = () => {
    if (timer) clearTimeout(timer);
    timer = null;
  };
  return throttled;
}

/**
 * Runs `refresh` whenever the journal changes (at most once a second, with a trailing
 * call) and returns the stop function, as the `$effect` cleanup of a screen that lists
 * what the journal holds.
 */
export function followJournal(refresh: () => void): () => void {
  const throttled = throttle(refresh, 1000);
  const stop = subscribe(events.journalChanged(throttled));
  return () => {
    stop();
    throttled.cancel();
  };
}
