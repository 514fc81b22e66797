//! A minimal rust-bin agent without dependencies: echoes the intent id and text.
//! Finds the two string fields by hand so the crate builds offline.
use std::io::{self, BufRead, Write};

fn field(line: &str, name: &str) -> String {
    let key = format!("\"{}\":\"", name);
    let start = match line.find(&key) { Some(i) => i + key.len(), None => return String::new() };
    let mut out = String::new();
    let mut escaped = false;
    for c in line[start..].chars() {
        if escaped { out.push('\\'); out.push(c); escaped = false; continue; }
        match c { '\\' => escaped = true, '"' => break, _ => out.push(c) }
    }
    out
}

fn main() {
    let mut line = String::new();
    io::stdin().lock().read_line(&mut line).unwrap();
    let id = field(&line, "id");
    let text = field(&line, "text");
    let mut stdout = io::stdout().lock();
    writeln!(stdout, "{{\"intent_id\":\"{}\",\"status\":\"ok\",\"text\":\"{}\",\"sources\":[\"rust\"]}}", id, text).unwrap();
}
