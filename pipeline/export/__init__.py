"""The export stage's machinery (stages/export.py strings it together), one job per module, lowest first:

onnx_graph          the student as ONNX: export, logits one text per call, batch invariance
tokenizer           tokenizer facts for ports, the bundle's tokenizer files, vocabulary trimming
quantize            dynamic int8 down a ladder of safer settings, static QDQ int8, the int8 teacher
files               bundle templates, predict.py, the browser demo, sha256 table, MLflow registration
variants            the variants the bundle can ship, built and measured; the one it recommends
executorch_program  model.pte / model.int8.pte (ExecuTorch, XNNPACK)
text_model          model.text.onnx: the tokenizer as onnxruntime-extensions operators in front
latency             every model timed side by side; the student against the int8 teacher
ort_format          ORT-format twins for ONNX Runtime Mobile, checked against their .onnx
mobile              ONNX Runtime's mobile usability checker (NNAPI, CoreML) as data
from_text           raw text in, label out, one text per call: student, int8 teacher and peers
measurements        every measured figure built once; metadata.json, metrics.json, export.json, MLflow
readme              the bundle's README.md from its templates (pipeline/bundle_files/)
"""
