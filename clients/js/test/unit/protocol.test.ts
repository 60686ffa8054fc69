import assert from "node:assert/strict";
import { test } from "node:test";
import { PresenceFullError, ServerError, serverError } from "../../src/errors.js";
import { judge, mayReconnect, parseServerMessage } from "../../src/protocol.js";
import { refreshDelay, tokenExp } from "../../src/token.js";
import { fakeToken } from "../fake.js";

test("dedupe: the next offset is delivered, earlier ones dropped, holes and new epochs announced", () => {
  const at = { epoch: "00000000000000aa", offset: 10 };
  assert.equal(judge(at, at.epoch, 11), "deliver");
  assert.equal(judge(at, at.epoch, 10), "duplicate");
  assert.equal(judge(at, at.epoch, 3), "duplicate");
  assert.equal(judge(at, at.epoch, 13), "gap");
  assert.equal(judge(at, "00000000000000bb", 1), "epoch_changed");
  assert.equal(judge(null, at.epoch, 5), "deliver");
});

test("close codes: 45xx and 1002, 1003, 1007, 1009 say do not reconnect unchanged", () => {
  for (const code of [1000, 1001, 1006, 1011, 4001, 4002, 4003, 4099, 4499]) assert.ok(mayReconnect(code), `${code}`);
  for (const code of [1002, 1003, 1007, 1009, 4500, 4501, 4599, 4999]) assert.ok(!mayReconnect(code), `${code}`);
});

test("malformed messages are told apart from unknown ops", () => {
  for (const text of ["", "nope", "[]", "null", "42", '"msg"', "{}", '{"op":7}', 'x{"op":"msg"}']) {
    assert.equal(parseServerMessage(text), undefined, text);
  }
  assert.equal(parseServerMessage(new Uint8Array([1])), undefined);
  assert.equal(parseServerMessage('{"op":"teleport"}'), "teleport", "an unknown op is given back as the op");
  for (const text of [
    '{"op":"msg","subject":"a","epoch":"e","data":1}',
    '{"op":"msg","subject":"a","epoch":"e","offset":-1,"data":1}',
    '{"op":"msg","subject":"a","epoch":"e","offset":1.5,"data":1}',
    '{"op":"msg","subject":"a","epoch":"e","offset":1}',
    '{"op":"msg","subject":5,"epoch":"e","offset":1,"data":1}',
    '{"op":"subscribed","subject":"a","epoch":"e","offset":1,"recovered":"yes"}',
    '{"op":"error","id":1}',
    '{"op":"ok","id":"1"}',
  ]) {
    assert.equal(parseServerMessage(text), JSON.parse(text).op, `${text}: only its op`);
  }
  const ok = parseServerMessage('{"op":"msg","subject":"a","epoch":"e","offset":1,"data":null,"extra":true}');
  assert.equal(typeof ok === "object" && ok.op, "msg", "unknown fields are ignored; null is data");
});

test("a token's exp is read from its payload; no exp, no refresh", () => {
  assert.equal(tokenExp(fakeToken({ sub: "1", exp: 1_900_000_000 })), 1_900_000_000);
  assert.equal(tokenExp(fakeToken({ sub: "1" })), undefined);
  assert.equal(tokenExp("not-a-jwt"), undefined);
  assert.equal(tokenExp("a.!!!.c"), undefined);
});

test("the refresh comes min(30 s, half the remaining life) before exp", () => {
  assert.equal(refreshDelay(3600, 0), 3_570_000);
  assert.equal(refreshDelay(4, 0), 2_000);
  assert.equal(refreshDelay(10, 20_000), 0, "already expired: at once");
});

test("join and leave need a subject and a member with a conn; presence_full is typed", () => {
  const join = '{"op":"join","subject":"live.1","member":{"conn":"n1.w0.s3.l1","user":"42","info":{"a":1}}}';
  assert.deepEqual(parseServerMessage(join), JSON.parse(join));
  assert.equal(typeof parseServerMessage('{"op":"leave","subject":"live.1","member":{"conn":"x","user":null}}'), "object");
  for (const text of ['{"op":"join","subject":"a"}', '{"op":"leave","subject":"a","member":{"user":"1"}}', '{"op":"join","member":{"conn":"x"}}', '{"op":"join","subject":"a","member":null}']) {
    assert.equal(parseServerMessage(text), JSON.parse(text).op, `${text}: only its op`);
  }
  const full = serverError({ code: "presence_full", message: "room.1 is full", subject: "room.1" });
  assert.ok(full instanceof PresenceFullError && full instanceof ServerError);
  assert.equal(full.subject, "room.1");
  assert.equal(full.code, "presence_full");
  assert.ok(!(serverError({ code: "forbidden", message: "no" }) instanceof PresenceFullError));
});
