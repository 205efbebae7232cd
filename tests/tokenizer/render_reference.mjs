// Reference chat-template renderer for the C++ oracle tests: @huggingface/jinja (pinned in
// tests/npm). Reads {"template": str, "contexts": [obj, ...]} (or {"cases": [...]}) JSON on stdin and prints a JSON
// array with one {"ok": str} or {"error": str} per context. Template() applies trim_blocks and
// lstrip_blocks, as transformers configures Jinja.
import { readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const npm = process.env.MLA_NPM_DIR ?? join(here, "..", "npm", "node_modules");
const { Template } = await import(pathToFileURL(join(npm, "@huggingface/jinja/dist/index.js")).href);

const input = JSON.parse(readFileSync(0, "utf8"));
// Either one template with many contexts, or {"cases": [{template, context}, ...]}.
const cases = input.cases ?? input.contexts.map((context) => ({ template: input.template, context }));
const out = cases.map(({ template, context }) => {
  try {
    return { ok: new Template(template).render(context) };
  } catch (e) {
    return { error: String(e.message ?? e) };
  }
});
process.stdout.write(JSON.stringify(out));
