/**
 * The errors the client hands the application: one base type with a
 * stable `code` (docs/sdk.md, "Errors"), and one sub-type per source.
 * Application code switches on `code`, never on `message`.
 */

/** Every error of the SDK. `code` is stable; `message` is for humans. */
export class MyriadError extends Error {
  constructor(
    readonly code: string,
    message: string = code,
  ) {
    super(message);
    this.name = new.target.name;
  }
}

/** The node answered a command with `error`; `code` is the node's own (docs/protocol.md, "Error codes"). */
export class ServerError extends MyriadError {}

/**
 * `presence_full`: a subscribe to a presence subject that already holds
 * its namespace's `presence_max_members` members. The subscription goes
 * to `unsubscribed` with this error; subscribe again once members leave.
 */
export class PresenceFullError extends ServerError {
  constructor(
    readonly subject: string,
    message: string,
  ) {
    super("presence_full", message);
  }
}

/** The node's `error` answer as a typed error: `presence_full` gets its own class. */
export function serverError(m: { code: string; message?: unknown; subject?: unknown }): ServerError {
  const message = String(m.message ?? m.code);
  return m.code === "presence_full" ? new PresenceFullError(String(m.subject ?? ""), message) : new ServerError(m.code, message);
}

/** A command was not answered within its timeout (`code` is `timeout`). */
export class TimeoutError extends MyriadError {
  constructor(what: string) {
    super("timeout", `${what} not answered in time`);
  }
}

/**
 * This user may not connect: thrown by the application's `getToken` when
 * its backend refuses (`code` `unauthorized`), or made by the client when
 * the node refused a fresh token (`code` `invalid_token`) or the backend's
 * connect proxy refused it (`proxy_refused`, `forbidden`; the message is
 * the backend's reason). Terminal: the client goes to `closed`.
 */
export class UnauthorizedError extends MyriadError {
  constructor(message = "unauthorized", code = "unauthorized") {
    super(code, message);
  }
}
