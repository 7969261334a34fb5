// What the end of a compaction means to the reader: the notice for a `compaction` event or for
// "Compact now"'s answer.

import { t } from "./dom.js";

// What actually happened: only a committed compaction folded anything into the summary. null:
// an outcome this page does not know (the caller clears the notice).
export function compactionNotice(outcome, messagesRolled) {
  switch (outcome) {
    case "committed":
      return { text: messagesRolled === 0 ? t("compaction_noop") : t("compaction_done"), level: "info" };
    case "skipped":
      return { text: t("compaction_skipped"), level: "info" };
    case "busy":
      return { text: t("compaction_busy"), level: "info" };
    case "conflict":
      return { text: t("compaction_conflict"), level: "info" };
    case "failed":
    case "rejected":
      return { text: t("compaction_failed"), level: "error" };
    default:
      return null;
  }
}
