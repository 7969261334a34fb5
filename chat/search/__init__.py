"""Message search: substring search over the messages a user owns, for the search API, the page's
search box, the model's `history_search` tool and automatic recall, and the Django admin.

`selectors.message_search` is the user-facing read (validation, ownership, paging, snippets);
`selectors.message_ids_search` the bare id search the others build on; `backends` holds the SQL
for each database (chat/migrations/0006 makes the indexes)."""
