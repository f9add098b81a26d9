// A long name in a table cell (a file path, a setting, an op such as reduce_scatter) may break after
// "/", "_", "." or "," instead of anywhere: a <wbr> after each, so a narrow column wraps between the
// parts of a name ("HWDIST_FLIGHT_" / "RECORDER" at worst), never inside a word. Copying the text
// copies no extra character.
document.addEventListener("DOMContentLoaded", function () {
  var long = /[^\s]{14,}/;
  document.querySelectorAll(".rst-content table td, .rst-content table th").forEach(function (cell) {
    var walker = document.createTreeWalker(cell, NodeFilter.SHOW_TEXT), nodes = [], node;
    while ((node = walker.nextNode())) {
      if (long.test(node.data) && /[\/_.,]/.test(node.data)) {
        nodes.push(node);
      }
    }
    nodes.forEach(function (text) {
      var parts = text.data.split(/(?<=[\/_.,])(?=\S)/), frag = document.createDocumentFragment();
      parts.forEach(function (part, i) {
        if (i) {
          frag.appendChild(document.createElement("wbr"));
        }
        frag.appendChild(document.createTextNode(part));
      });
      text.parentNode.replaceChild(frag, text);
    });
  });
});
