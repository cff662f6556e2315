// Text rendering of the visible page for the env's observation. Called through WebDriver as
// `execute_script(source, rootSelector, statusBody)`; returns {title, elements, status}, where
// status is what the backend's status function body returns (its verifier), so one round trip
// serves a whole step. Each listed element gets a fresh `data-eid` so GUI actions can address it
// until the next observation.
var root = document.querySelector(arguments[0]) || document.body;
var INTERACTIVE = {A: 1, BUTTON: 1, INPUT: 1, SELECT: 1, TEXTAREA: 1};
var ROLE_BY_TAG = {A: 'link', BUTTON: 'button', SELECT: 'combobox', TEXTAREA: 'textbox', TD: 'cell', TH: 'columnheader',
  H1: 'heading', H2: 'heading', H3: 'heading', H4: 'heading', LI: 'listitem', LABEL: 'label', IMG: 'image'};
var old = document.querySelectorAll('[data-eid]');
for (var i = 0; i < old.length; i++) old[i].removeAttribute('data-eid');
var out = [];
var nextId = 1;

function squash(s) { return (s || '').replace(/\s+/g, ' ').trim().slice(0, 120); }
function ownText(el) {
  var s = '';
  for (var c = el.firstChild; c; c = c.nextSibling) if (c.nodeType === 3) s += c.textContent;
  return squash(s);
}
// Text of an element without the text of interactive elements nested in it (they are listed
// on their own), so a list row reads "Ines Silva Budget review", not "Star Ines Silva ...".
function deepText(el) {
  var parts = [];
  (function collect(node) {
    for (var c = node.firstChild; c; c = c.nextSibling) {
      if (c.nodeType === 3) parts.push(c.textContent);
      else if (c.nodeType === 1 && !INTERACTIVE[c.tagName] && !c.dataset.act) collect(c);
    }
  })(el);
  return squash(parts.join(' '));
}
function visible(el) {
  if (!el.getClientRects().length) return false;
  var st = window.getComputedStyle(el);
  return st.visibility !== 'hidden' && st.display !== 'none';
}
function roleOf(el) {
  if (el.getAttribute('role')) return el.getAttribute('role');
  if (el.tagName === 'INPUT') {
    var t = (el.type || 'text').toLowerCase();
    if (t === 'checkbox' || t === 'radio') return t;
    if (t === 'button' || t === 'submit') return 'button';
    return 'textbox';
  }
  return ROLE_BY_TAG[el.tagName] || (el.dataset.act ? 'button' : 'text');
}
function isInteractive(el) {
  return INTERACTIVE[el.tagName] || el.dataset.act || el.hasAttribute('onclick') ||
    el.getAttribute('role') === 'button' || el.hasAttribute('tabindex') ||
    window.getComputedStyle(el).cursor === 'pointer';
}
function walk(el, insideInteractive) {
  if (!visible(el)) return;
  var interactive = isInteractive(el);
  var text = interactive && !insideInteractive ? (deepText(el) || squash(el.value || el.alt || el.title || ''))
                                                : ownText(el);
  var listed = (interactive && !insideInteractive) || (!insideInteractive && text) ||
               (insideInteractive && (INTERACTIVE[el.tagName] || el.dataset.act));
  if (listed) {
    el.setAttribute('data-eid', String(nextId));
    var item = {id: nextId++, role: roleOf(el), text: interactive && insideInteractive ? deepText(el) : text,
                states: []};
    if (el.tagName === 'INPUT' || el.tagName === 'TEXTAREA') {
      if (el.type === 'checkbox' || el.type === 'radio') { if (el.checked) item.states.push('checked'); item.text = squash(el.getAttribute('aria-label') || el.name || text); }
      else { item.value = el.value; item.text = squash(el.getAttribute('aria-label') || el.placeholder || el.name || ''); }
    } else if (el.tagName === 'SELECT') {
      item.value = el.selectedIndex >= 0 ? el.options[el.selectedIndex].text : '';
      item.text = squash(el.getAttribute('aria-label') || el.name || '');
      item.states.push('options: ' + Array.prototype.map.call(el.options, function (o) { return o.text; }).join(' | '));
    }
    if (el.disabled) item.states.push('disabled');
    if (document.activeElement === el) item.states.push('focused');
    if (el.getAttribute('aria-selected') === 'true' || el.getAttribute('aria-current')) item.states.push('selected');
    if (el.getAttribute('aria-pressed') === 'true') item.states.push('pressed');
    if (el.dataset.k) item.key = el.dataset.k;
    out.push(item);
  }
  if (el.tagName === 'SELECT') return;
  for (var c = el.firstElementChild; c; c = c.nextElementSibling) walk(c, insideInteractive || (interactive && listed));
}
walk(root, false);
return {title: document.title, elements: out, status: arguments[1] ? (new Function(arguments[1]))() : null};
