/**
 * Typed events for one object. A listener that throws never reaches the
 * emitter's caller (the client's read loop): it is handed to `caught`,
 * which the client counts and reports (docs/sdk.md, "Objects").
 */

export type Listener<T> = (payload: T) => void;

export class Emitter<Events extends object> {
  private listeners: { [K in keyof Events]?: Listener<Events[K]>[] } = {};

  /** @internal Where a listener's exception goes; set by the client. */
  caught: (error: unknown) => void = () => {};

  /** Adds `listener` for `name`; returns a function that removes it. */
  on<K extends keyof Events>(name: K, listener: Listener<Events[K]>): () => void {
    // A new list, never one changed in place: an emit in progress keeps
    // the list it started with, so a listener added or removed by a
    // listener waits for the next event, and emit needs no copy.
    this.listeners[name] = [...(this.listeners[name] ?? []), listener];
    return () => this.off(name, listener);
  }

  off<K extends keyof Events>(name: K, listener: Listener<Events[K]>): void {
    const list = this.listeners[name];
    if (list) this.listeners[name] = list.filter((l) => l !== listener);
  }

  /** @internal */
  emit<K extends keyof Events>(name: K, payload: Events[K]): void {
    const list = this.listeners[name];
    if (!list) return;
    for (let i = 0; i < list.length; i++) {
      try {
        list[i]!(payload);
      } catch (error) {
        this.caught(error);
      }
    }
  }
}
