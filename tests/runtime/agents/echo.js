// A minimal node agent: echoes the intent text.
let data = "";
process.stdin.setEncoding("utf8");
process.stdin.on("data", (chunk) => { data += chunk; });
process.stdin.on("end", () => {
  const intent = JSON.parse(data.split("\n")[0]);
  process.stdout.write(JSON.stringify({ intent_id: intent.id, status: "ok", text: intent.text, sources: ["node"] }) + "\n");
});
