package io.inferpool;

/**
 * A model that inferpool's {@code java} runtime serves (docs/runtimes/java.md).
 *
 * <p>Implement {@link #predict(double[][])}; give the class a public constructor without
 * arguments. A batch has one row per instance of the request; the answer has one row per
 * batch row. The server picks the variant from the request's datatype: FP32 calls
 * {@link #predict(float[][])}, BYTES calls {@link #predict(String[])}, every other number
 * type calls {@link #predict(double[][])}.
 *
 * <p>Throw {@link IllegalArgumentException} for input the model refuses (the client gets a
 * 400 with its message); anything else thrown is the model's fault (a 500 with its message).
 * One instance serves the requests of one worker process, one call at a time.
 */
public interface Model {

    /** The answer for a batch of numbers: {@code rows x columns} in, one row per input row out. */
    double[][] predict(double[][] batch);

    /** The answer for a batch of FP32 numbers; by default through the double variant. */
    default float[][] predict(float[][] batch) {
        double[][] wide = new double[batch.length][];
        for (int i = 0; i < batch.length; i++) {
            wide[i] = new double[batch[i].length];
            for (int j = 0; j < batch[i].length; j++) {
                wide[i][j] = batch[i][j];
            }
        }
        double[][] answer = predict(wide);
        float[][] narrow = new float[answer.length][];
        for (int i = 0; i < answer.length; i++) {
            narrow[i] = new float[answer[i].length];
            for (int j = 0; j < answer[i].length; j++) {
                narrow[i][j] = (float) answer[i][j];
            }
        }
        return narrow;
    }

    /** The answer for a batch of strings (BYTES), one string per row; none by default. */
    default String[] predict(String[] batch) {
        throw new IllegalArgumentException("this model takes numbers, not strings");
    }

    /**
     * The model's inputs and outputs as JSON, V2 metadata's shape:
     * {@code {"inputs": [{"name": "x", "datatype": "FP64", "shape": [-1, 4]}], "outputs": [...]}}.
     * Null (the default): one FP64 input and one FP64 output, "input-0" and "output-0".
     */
    default String metadata() {
        return null;
    }
}
