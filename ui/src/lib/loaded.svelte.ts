import { errorMessage } from "./format";

/**
 * What a screen loads from the broker: `value` is `null` until the first load answers.
 * A failed load is shown as `error` only while nothing was loaded: a refresh that fails
 * keeps the last good answer on screen.
 */
export class Loaded<T> {
  value = $state<T | null>(null);
  error = $state<string | null>(null);

  constructor(private readonly fetch: () => Promise<T>) {}

  load = async () => {
    this.error = null;
    try {
      this.value = await this.fetch();
    } catch (e) {
      if (this.value === null) this.error = errorMessage(e);
    }
  };
}
