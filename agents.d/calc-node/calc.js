#!/usr/bin/env node
// calc: one JSON intent on stdin, one JSON result on stdout.
//
// Finds the arithmetic expression in the intent text ("what is 2 + 3 * (4 - 1)?")
// and evaluates it with a small recursive-descent parser: + - * / % ^, unary
// minus, parentheses, decimals. No eval, no dependencies. Bad input (no
// expression, syntax error, division by zero) answers with status "error".
"use strict";

class CalcError extends Error {}

function tokenize(src) {
  const tokens = [];
  let i = 0;
  while (i < src.length) {
    const c = src[i];
    if (c === " " || c === "\t") { i += 1; continue; }
    if ("+-*/%^()".includes(c)) { tokens.push({ op: c, pos: i }); i += 1; continue; }
    const m = /^(\d+(\.\d*)?|\.\d+)/.exec(src.slice(i));
    if (m) { tokens.push({ num: Number(m[0]), pos: i }); i += m[0].length; continue; }
    throw new CalcError(`unexpected character ${JSON.stringify(c)} at position ${i + 1}`);
  }
  return tokens;
}

// expr := term (('+'|'-') term)* ; term := unary (('*'|'/'|'%') unary)*
// unary := '-' unary | power ; power := atom ('^' unary)? ; atom := number | '(' expr ')'
function evaluate(src) {
  const tokens = tokenize(src);
  let k = 0;
  const peek = () => tokens[k];
  const isOp = (op) => peek() !== undefined && peek().op === op;
  function expr() {
    let value = term();
    while (isOp("+") || isOp("-")) {
      const op = tokens[k++].op;
      const right = term();
      value = op === "+" ? value + right : value - right;
    }
    return value;
  }
  function term() {
    let value = unary();
    while (isOp("*") || isOp("/") || isOp("%")) {
      const op = tokens[k++].op;
      const right = unary();
      if ((op === "/" || op === "%") && right === 0) throw new CalcError("division by zero");
      value = op === "*" ? value * right : op === "/" ? value / right : value % right;
    }
    return value;
  }
  function unary() {
    if (isOp("-")) { k += 1; return -unary(); }
    if (isOp("+")) { k += 1; return unary(); }
    return power();
  }
  function power() {
    const base = atom();
    if (isOp("^")) { k += 1; return Math.pow(base, unary()); }
    return base;
  }
  function atom() {
    const t = peek();
    if (t === undefined) throw new CalcError("the expression ends too early");
    if (t.num !== undefined) { k += 1; return t.num; }
    if (t.op === "(") {
      k += 1;
      const value = expr();
      if (!isOp(")")) throw new CalcError("missing closing parenthesis");
      k += 1;
      return value;
    }
    throw new CalcError(`unexpected ${JSON.stringify(t.op)} at position ${t.pos + 1}`);
  }
  const value = expr();
  if (k < tokens.length) throw new CalcError(`unexpected ${JSON.stringify(tokens[k].op ?? String(tokens[k].num))} at position ${tokens[k].pos + 1}`);
  if (!Number.isFinite(value)) throw new CalcError("the result is not a finite number");
  return value;
}

// The first run of expression characters that holds a digit: "what is 2+2?" -> "2+2".
function extract(text) {
  const runs = text.match(/[\d.+\-*/%^()\s]+/g) || [];
  const run = runs.find((r) => /\d/.test(r));
  if (run === undefined) throw new CalcError("no arithmetic expression found in the text");
  return run.trim();
}

function format(value) {
  return Number.isInteger(value) ? String(value) : String(Number(value.toPrecision(12)));
}

function answer(line) {
  let intent;
  try {
    intent = JSON.parse(line);
  } catch (err) {
    return { intent_id: null, status: "error", text: `bad intent: ${err.message}`, sources: [] };
  }
  const id = intent && typeof intent.id === "string" ? intent.id : null;
  if (id === null || typeof intent.text !== "string") {
    return { intent_id: id, status: "error", text: "bad intent: needs string fields id and text", sources: [] };
  }
  try {
    const expression = extract(intent.text);
    return { intent_id: id, status: "ok", text: `${expression} = ${format(evaluate(expression))}`, sources: [] };
  } catch (err) {
    if (!(err instanceof CalcError)) throw err;
    return { intent_id: id, status: "error", text: err.message, sources: [] };
  }
}

let input = "";
process.stdin.setEncoding("utf8");
process.stdin.on("data", (chunk) => { input += chunk; });
process.stdin.on("end", () => {
  const line = input.split("\n", 1)[0];
  process.stdout.write(JSON.stringify(answer(line)) + "\n");
});
