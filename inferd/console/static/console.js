// Console behaviour that needs a script (no inline scripts: the CSP forbids them).
//  - [data-copy="#id"] buttons copy that element's text to the clipboard.
//  - A freshly revealed access token is kept in this tab's session storage,
//    so the playground can use it; it never goes back to the server.

export function tokenKey(endpointId) {
  return `inferd-token:${endpointId}`;
}

document.addEventListener("click", async (event) => {
  const button = event.target.closest("[data-copy]");
  if (!button) return;
  const source = document.querySelector(button.dataset.copy);
  if (!source) return;
  await navigator.clipboard.writeText(source.textContent.trim());
  const label = button.textContent;
  button.textContent = "Copied";
  setTimeout(() => { button.textContent = label; }, 1500);
});

function keepRevealedToken() {
  const reveal = document.querySelector("[data-testid=token-reveal]");
  if (!reveal) return;
  const token = reveal.querySelector("#token").textContent.trim();
  sessionStorage.setItem(tokenKey(reveal.dataset.endpoint), token);
}

if (document.readyState === "loading") {
  document.addEventListener("DOMContentLoaded", keepRevealedToken);
} else {
  keepRevealedToken();
}
