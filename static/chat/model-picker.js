// The chat's model, chosen in its header among the ones the operator allows
// (config.models, LLM_ALLOWED_MODELS). "" = the default: the agent's model, else the server's.
// The next send uses the choice; the server refuses a model it does not allow.

import { api } from "./api.js";
import { $, config, el, errorNotice, notice, t } from "./dom.js";

export function setupModelPicker(session, { setBudget }) {
  const select = $("model-select");
  const box = select?.closest(".model-pick");
  if (!select || !box) return;
  const models = config.models || [];
  if (!models.length) {
    box.hidden = true;
    return;
  }
  const fallback = config.default_model || "";
  const options = [el("option", { value: "", text: t("model_default", { model: fallback }) })];
  // A choice the operator has since removed stays visible (and unused) until changed.
  const listed = session.model && !models.includes(session.model) ? [...models, session.model] : models;
  for (const name of listed) options.push(el("option", { value: name, text: name }));
  select.replaceChildren(...options);
  let saved = session.model || "";
  select.value = saved;
  select.addEventListener("change", async () => {
    select.disabled = true;
    try {
      const updated = await api.updateSession(session.id, { model: select.value });
      saved = updated.model;
      setBudget(updated.context_budget);
      notice(t("model_set", { model: updated.model || fallback }));
    } catch (err) {
      select.value = saved;
      errorNotice(err);
    } finally {
      select.disabled = false;
    }
  });
}
