// ESLint for the page's JavaScript: `make lint` runs it on static/chat and tests/js.
import js from "@eslint/js";
import globals from "globals";

export default [
  { ignores: ["node_modules/", "staticfiles/", ".venv/"] },
  js.configs.recommended,
  {
    files: ["static/chat/**/*.js"],
    languageOptions: { ecmaVersion: 2022, sourceType: "module", globals: globals.browser },
    rules: {
      // A module past ~500 lines is two modules, a function past 80 two functions
      // (docs/architecture.md); counted as the file reads, comments included.
      "max-lines": ["error", { max: 500 }],
      "max-lines-per-function": ["error", { max: 80 }],
    },
  },
  {
    files: ["tests/js/**/*.mjs", "eslint.config.js"],
    languageOptions: { ecmaVersion: 2022, sourceType: "module", globals: globals.node },
  },
];
