// The query of a hit opened in another chat, carried to that chat's page (sessionStorage, read
// once) so it shows the same results.

const CARRIED = "cadau.search";

export function searchCarry(query) {
  try {
    sessionStorage.setItem(CARRIED, query);
  } catch {
    // Storage refused: the other chat's page opens without the results.
  }
}

// The carried query, taken (a reload does not search again); null when there is none.
export function searchCarried() {
  try {
    const query = sessionStorage.getItem(CARRIED);
    sessionStorage.removeItem(CARRIED);
    return query;
  } catch {
    return null;
  }
}
